"""Speed benchmarks against Hugging Face TRL: ``python -m benchmarks.run`` (see benchmarks/README.md)."""
