"""Benchmarks: ``benchmarks.vs_trl`` (speed against Hugging Face TRL, side by side) and ``benchmarks.ops`` (PPO steps,
memory, scaling, sweeps, the claims suite, the GPU check); see benchmarks/README.md."""
