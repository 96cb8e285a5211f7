"""GPU observation: backends (NVML, simulated), one /proc scan per tick, attribution."""
