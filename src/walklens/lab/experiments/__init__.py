"""Experiments over HellaSwag (seed 000, sec. 5, Figs. 10, 13-16; footnote 11): runs of one scheme over many
items, sweeps of many schemes, experiment files, agreement between runs, honest-best statistics and summaries,
and compaction's HellaSwag runs and curves.

* :mod:`.runsetup` — :class:`~.runsetup.RunSetup`, what every run runs with (shots, few-shot pool and seed, data
  id, results store, concept cache, workers, progress);
* :mod:`.runner` — one scorer (baseline, Test 1, Test 2, a compacted prefix) over items, with resume;
* :mod:`.sweep` — a grid of schemes over items in shards, locally or on Ray;
* :mod:`.grid`, :mod:`.experiment` — scheme grids and experiment files (TOML);
* :mod:`.stats`, :mod:`.summary` — honest best scores and the summary of a results database;
* :mod:`.agreement` — how two runs of the same work agree (dtypes, devices, backends);
* :mod:`.compaction`, :mod:`.curves` — HellaSwag with a compacted prefix; compression-retention curves.
"""
