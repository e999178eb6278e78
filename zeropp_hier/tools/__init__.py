"""Command-line tools: the analytical planner and ``zeropp-hier plan|probe`` (cli), and the
sweep comparison table (sweep_report)."""
