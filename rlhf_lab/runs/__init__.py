"""What a job leaves and how it runs: the artifact cache, MLflow tracking, how runs end, the job's identity, the
multi-process launch, the progress bar and the process set-up."""
