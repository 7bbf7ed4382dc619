"""``cadence trace``: where each engine step's time goes, from a torch-profiler or Nsight trace.

Modules: ``steps`` (a trace into per-step records), ``summary`` (the per-step figures),
``floors`` (layer ops and their bytes), ``kernels`` (the per-kernel table), ``plots``,
``report`` (the HTML page), ``compare`` (two runs side by side), ``load`` (running the engine
under a profiler) and ``cli`` (the command). Nothing here but ``load`` imports torch.
"""
