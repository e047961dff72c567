"""``%forge_eval``: an evaluation of the current run pinned to its weight version (``Run.evaluate``)."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from forge_nb.magics import _display
from forge_nb.magics._runs import Runs

if TYPE_CHECKING:
    from forge_nb.run import Run


@magics_class
class EvalMagics(Magics):
    def __init__(self, shell: Any, runs: Runs):
        super().__init__(shell)
        self.runs = runs

    @magic_arguments()
    @argument("prompts", nargs="?", default=None,
              help="a variable holding a task or a list of prompts (default: the run's task's held-out prompts)")
    @argument("-k", type=int, default=1, help="answers per prompt (1: greedy; k > 1 sampled): avg@k and pass@k")
    @argument("-n", type=int, default=None, help="held-out prompts of the task (default loop.eval_prompts)")
    @argument("--temperature", type=float, default=None, help="sampling temperature for k > 1 (default: the run's)")
    @argument("--correct-at", type=float, default=1.0, help="the reward at which an answer passes (default 1.0)")
    @argument("--episode-fn", dest="episode_fn", default=None,
              help="a variable holding an episode function that plays each prompt as a group (verifiers_episode(env))")
    @argument("--name", help="the run to evaluate (its name or a variable holding a Run); needed with several")
    @argument("-o", dest="output", help="also put the values (a dict) in this variable")
    @line_magic
    def forge_eval(self, line: str) -> Coroutine[Any, Any, None]:
        """Evaluate the run's current weight version on held-out prompts: k answers each, avg@k and pass@k."""
        args = parse_argstring(self.forge_eval, line)
        if args.k < 1:
            raise UsageError(f"%forge_eval -k {args.k}: k is the number of answers per prompt, an integer >= 1")
        prompts, episode_fn = (self._variable(name) for name in (args.prompts, args.episode_fn))
        return self._eval(self.runs.get(args.name), prompts, episode_fn, args)

    def _variable(self, name: str | None) -> Any:
        if name is None:
            return None
        if name not in self.shell.user_ns:
            raise UsageError(f"%forge_eval {name}: no variable of that name; give a variable holding a task or a list "
                             "of prompts (or an episode function for --episode-fn), or nothing for the run's task")
        return self.shell.user_ns[name]

    async def _eval(self, run: Run, prompts: Any, episode_fn: Any, args: Any) -> None:
        try:
            values = await run.evaluate(prompts, k=args.k, n=args.n, temperature=args.temperature,
                                        correct_at=args.correct_at, episode_fn=episode_fn)
        except ValueError as error:
            raise UsageError(str(error)) from None
        if args.output:
            self.shell.user_ns[args.output] = values
        rows = [{"measure": k, "value": v} for k, v in values.items() if k.startswith("eval/")]
        display(_display.Table(rows, title=f"run {run.name!r}: version {values['version']}, "
                                           f"{values['prompts']} prompts x {values['k']} answers"))
