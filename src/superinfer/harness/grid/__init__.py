"""Grid room: sweep cells, their cache and executors, sweeps and the fleet planner."""
