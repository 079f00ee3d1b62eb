"""`harness calibrate`: measuring a cluster's rates for the step-time model, and writing its calibration file.

The calibration's logic lives here; the file it writes and the rates the planner prices with are
harness.plan.calibration's (the planner, two floors down, reads the file), and the command is harness.cli.calibrate
(options and printing). The modules, in the order a calibration runs them:

- `run`: the orchestration — the measuring processes started locally (one device process, then a group of ranks
  per group size) or as SLURM jobs, their parts read back and merged into the file (`calibrate`);
- `process`: the measuring processes' entry point (`python -m harness.calibrate.process compute|collectives`):
  each set up as a sweep's rank, each writing its part through the file's typed models;
- `device`: what one process measures on its device (GEMMs, elementwise, attention, per-op, optimizer);
- `group`: what a process group measures together (the host's sharing, the collectives' curves);
- `framework`: each strategy family's framework overhead, at one rank.

It imports the worker (strategies, allocator, timing) and launch (SLURM's preflight and job options), so it sits on
the floor above them (docs/ARCHITECTURE.md); importing this package imports neither torch nor submitit.
"""
