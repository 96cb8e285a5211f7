"""GPU profiles for JupyterHub: tiers, team quotas, admission, and the spawner glue.

Pure parts: ``tiers`` (what a researcher can ask for), ``quota`` (Kueue-style admission) and
``estimate`` (how much GPU memory a model needs). Glue, loaded by the hub only: ``spawner`` (the
shared mixin), ``kubespawner`` and ``local`` (workstations), ``form``, ``handlers`` and
``hubconfig`` (``add_gpu_profiles``).
"""
