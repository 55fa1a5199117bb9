"""``flashtile bench`` and its parts: the grid (``grid``), the peers (``peers``), the timer (``timing``), the
sub-command (``bench``), the CSV (``results``) and the figures (``plots``)."""
