"""Training: one loop (schedule, resume, log, plot) and the trainers built on it."""
