"""The job runtime: one table of job kinds (engine.jobs.kinds), the queue's runner and its worker
process, and the `submit_*` calls that check a job and queue it. Every other package is below this
one: search, data builds, evaluation and training know nothing of jobs."""
