"""Statistics: per-task summaries kept by writers (task_stats), the figures of ``expstore
stats`` computed where the rows are (summary), and building summaries (summary_build)."""
