"""What a finished group passes before the replay buffer (``dynamic``: dynamic sampling, overlong masking;
``quarantine``: episodes held out for a reason, counted) and the books of where every accepted episode ended
(``ledger``)."""
