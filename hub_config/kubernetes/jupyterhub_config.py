# jupyter-gpu-gov on Kubernetes (Zero to JupyterHub): GPU tiers, team quotas and the governor.
#
# The cluster this describes:
# - 4 HGX H100 nodes, 8 x H100 80 GB SXM each, NVLink/NVSwitch between the cards of a node. Three
#   nodes serve single cards, one serves NVLink pairs (labelled by the admin, see H100_POOL).
# - 2 H200 nodes, 8 x H200 141 GB each, partitioned into MIG slices by the GPU operator's MIG
#   manager with the *mixed* strategy (the device plugin advertises nvidia.com/mig-<profile>):
#   one node as all-3g.71gb (2 slices per card, 16 in all), one as all-1g.18gb (7 per card, 56).
# - GPU nodes carry the NoSchedule taint nvidia.com/gpu; GPU feature discovery labels them
#   (nvidia.com/gpu.product, nvidia.com/gpu.memory, nvidia.com/mig.strategy).
# - Three teams, each a Hub group with the property {"gpu-gov/team": true}: vision, nlp, robotics.
#
# How to use it (see README.md next to this file): mount it into the hub pod with hub.extraFiles
# at /usr/local/etc/jupyterhub/jupyterhub_config.d/gpu-gov.py. The chart's jupyterhub_config.py
# runs every file there after its own settings, like a hub.extraConfig entry (its `c` is ours).
# The governor, a managed service in the hub pod, loads the same file for its c.GpuGovernor.*
# settings and skips the hub wiring below. The file also loads on its own with traitlets
# (`c = get_config()`), which is how the tests read it: nothing here talks to the cluster.
import os

try:
    c  # noqa: B018  (hub.extraConfig / jupyterhub_config.d: the chart's config defines `c`)
except NameError:
    c = get_config()  # noqa: F821  (a file that traitlets loads: the hub's or the governor's)

# Where this file is mounted; the governor is told to load it from there.
THIS_FILE = os.environ.get(
    "GPU_GOV_CONFIG_FILE", "/usr/local/etc/jupyterhub/jupyterhub_config.d/gpu-gov.py"
)
# The hub pod's Service (the chart names it "hub"), with port 10101 added through
# hub.service.extraPorts: the proxy routes /services/gpu-gov/ there, and single-user pods report
# their GPU use there.
GOVERNOR_URL = os.environ.get("GPU_GOV_URL", "http://hub:10101")
# Set by JupyterHub in the environment of its managed services: this file is being read by the
# governor, not the hub.
IN_GOVERNOR = os.environ.get("JUPYTERHUB_SERVICE_NAME") == "gpu-gov"

# --- GPU tiers --------------------------------------------------------------------------------
# A tier is what a researcher picks on the spawn form. Each asks for one extended resource
# (nvidia.com/gpu for whole cards, nvidia.com/mig-<profile> for slices), selects its nodes by
# GPU feature discovery labels and tolerates the nvidia.com/gpu taint; `max_age` is a hard cap
# the governor enforces (warn, checkpoint, stop).
#
# H100 nodes are split into a pool for single cards and a pool for NVLink pairs by a label the
# admin sets (`kubectl label node <node> node.example.org/gpu-pool=h100-pairs`). Capacity is
# counted per tier, so tiers must not draw on the same cards: if singles could land on the pairs
# node, four single servers spread over it would leave no two free cards for a pair that
# admission has already granted.
H100_POOL = "node.example.org/gpu-pool"
# HGX boards report the SXM product; pinning it keeps these tiers off any PCIe H100 (no NVLink).
H100_SXM = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}

c.GpuProfiles.tiers = [
    {
        "name": "h100",
        "display_name": "H100 80 GB",
        "description": "A whole H100: training and fine-tuning up to ~7B parameters.",
        "gpu": "H100-80GB",
        "interconnect": "nvlink",
        "node_selector": {**H100_SXM, H100_POOL: "h100-singles"},
        "max_age": "3d",
        # CPU and memory in proportion to one card's share of the node (112 cores, 2 TB).
        "kubespawner_override": {
            "cpu_guarantee": 12,
            "cpu_limit": 14,
            "mem_guarantee": "200G",
            "mem_limit": "240G",
        },
    },
    {
        "name": "h100x2",
        "display_name": "2 x H100 80 GB, NVLink",
        "description": "Two NVLink-connected H100s on one node: multi-GPU training.",
        "gpu": "H100-80GB",
        "count": 2,
        "interconnect": "nvlink",
        "node_selector": {**H100_SXM, H100_POOL: "h100-pairs"},
        # The scarcest tier: a shorter hard cap, so pairs come back for the next run.
        "max_age": "2d",
        "kubespawner_override": {
            "cpu_guarantee": 24,
            "cpu_limit": 28,
            "mem_guarantee": "400G",
            "mem_limit": "480G",
        },
    },
    {
        "name": "h200-3g",
        "display_name": "Half an H200 (MIG 3g.71gb)",
        "description": "71 GB of an H200: inference of large models, LoRA fine-tuning.",
        "gpu": "H200-141GB",
        "mig": "3g.71gb",  # resource nvidia.com/mig-3g.71gb, nodes with nvidia.com/mig.strategy=mixed
        "max_age": "3d",
        "kubespawner_override": {"cpu_limit": 8, "mem_guarantee": "96G", "mem_limit": "128G"},
    },
    {
        "name": "h200-1g",
        "display_name": "Small H200 slice (MIG 1g.18gb)",
        "description": "18 GB of an H200: notebooks, small models, trying things out.",
        "gpu": "H200-141GB",
        "mig": "1g.18gb",
        "max_age": "1d",
        "kubespawner_override": {"cpu_limit": 4, "mem_guarantee": "24G", "mem_limit": "32G"},
    },
]

# Devices per tier in the whole cluster, counted as cards for whole-card tiers (a pair is 2) and
# as slices for MIG tiers: 3 nodes x 8 single cards, 1 node of 8 cards in pairs, 8 H200 x 2 half
# slices, 8 H200 x 7 small slices. Admission never grants more than this, whatever the quotas
# say. Change it with the hardware (or a new MIG layout).
c.GpuProfiles.capacity = {"h100": 24, "h100x2": 8, "h200-3g": 16, "h200-1g": 56}

# --- Team quotas (Kueue's model: tiers are its resource flavors) -----------------------------
# Amounts are devices, as in capacity: cards (so multiples of 2 for pairs) or slices.
# guaranteed: devices a team can always get. borrowing_limit: how many more it may take from what
#   the others leave unused (such servers are labelled gpu-gov/borrowed: "true", given shorter
#   idle limits below, and reclaimed first). lending_limit: how much of its unused guarantee a
#   team lends out (absent: all). user_cap: GPU-equivalents one person may hold at once (an H100
#   counts 1, a pair 2, a 3g.71gb slice 0.5, a 1g.18gb slice 1/7). priority: a higher-priority
#   team that wants to borrow may reclaim what a lower-priority team borrowed.
# The guarantees add up to the capacity on the scarce tiers (24 single H100s: 10 + 10 + 4), so
# every team can always have its share; the rest (one pair, two half H200s, 16 small slices) is
# the shared pool everyone borrows from.
c.GpuProfiles.quotas = {
    # Computer vision: steady training on whole cards, small slices for labelling notebooks.
    "vision": {
        "guaranteed": {"h100": 10, "h100x2": 2, "h200-1g": 16},  # one pair
        "borrowing_limit": {"h100": 4, "h100x2": 2, "h200-3g": 2},
        "tiers": ["h100", "h100x2", "h200-3g", "h200-1g"],
        "user_cap": 2,  # one pair, or two single cards, per person
        "priority": 5,
    },
    # NLP: fine-tuning needs pairs and large slices; deadline-driven, so it outranks the others
    # when borrowing. It may try anything (tiers "*") but holds no small slices of its own.
    "nlp": {
        "guaranteed": {"h100": 10, "h100x2": 4, "h200-3g": 10},  # two pairs
        "borrowing_limit": {"h100": 4, "h100x2": 2, "h200-3g": 4},
        "tiers": "*",
        "user_cap": 2,
        "priority": 10,
    },
    # Robotics: many short simulation and policy-evaluation notebooks on small slices, a few
    # cards for training. It lends at most 8 of its idle small slices: its evaluation sweeps
    # start at short notice and must find slices free.
    "robotics": {
        "guaranteed": {"h100": 4, "h200-3g": 4, "h200-1g": 24},
        "borrowing_limit": {"h100": 2, "h200-3g": 2},
        "lending_limit": {"h200-1g": 8},
        "user_cap": 1,
        "priority": 0,
    },
}
# Teams are Hub groups with the property {"gpu-gov/team": true} (create them in the admin page or
# through the REST API; OAuth group claims can be used instead with auth_state_teams_key).
c.GpuProfiles.projects = {
    "vision": ["detection", "segmentation", "labelling"],
    "nlp": ["summaries", "retrieval", "fine-tuning"],
    "robotics": ["grasping", "sim2real"],
}
c.GpuProfiles.require_project = True  # every GPU server names its project, for showback
c.GpuProfiles.allow_no_gpu = True  # a CPU-only server is the default and counts against nothing

# --- The GPU governor (read by the governor process; the hub ignores c.GpuGovernor) -----------
# Idle GPUs are warned, checkpointed and stopped after the policy's limits; stop-server frees the
# pod's GPU allocation (shutting kernels down would not, the pod keeps its device).
c.GpuGovernor.ip = "0.0.0.0"  # listen where the hub Service's port 10101 reaches it
c.GpuGovernor.db_url = os.environ.get("GPU_GOV_DB_URL", "sqlite:////srv/jupyterhub/gpu-gov.sqlite")
c.GpuGovernor.dcgm_prometheus_url = os.environ.get(
    "GPU_GOV_PROMETHEUS_URL", "http://prometheus-operated.monitoring.svc:9090"
)
# Only the exporter's series are DCGM's word: any other target of that Prometheus (a user's pod
# scraped by annotation, a Pushgateway) could publish a series of a DCGM name. The GPU
# operator's exporter is scraped as job "nvidia-dcgm-exporter", the standalone chart's as
# "dcgm-exporter"; set yours (docs/kubernetes.md).
c.GpuGovernor.dcgm_prometheus_selector = os.environ.get(
    "GPU_GOV_DCGM_SELECTOR", 'job=~"(nvidia-)?dcgm-exporter"'
)
# Behind a service mesh's sidecar (Istio, Linkerd: it connects from 127.0.0.1) or SNAT, every
# server reaches the governor from one address: raise the per-address caps (docs/api.md,
# "Where every server is one address").
# c.GpuGovernor.max_connections_per_address = 0  # only the cap on all connections
# c.GpuGovernor.hub_checks_per_address = 100
c.GpuGovernor.timeout = 3600  # servers that send no GPU report: jupyterhub-idle-culler's rule
c.GpuGovernor.policy_defaults = {
    "warn_after": "1h",  # of GPU idleness
    "cull_after": "2h",
    "user_activity_grace": "15m",  # typing in a notebook postpones a warning this long
    "away_after": "2h",  # nobody at the notebook this long: warned as soon as the GPU is idle
    "extension_step": "1h",
    "max_extensions": 2,
    "cull_action": "stop-server",
}
c.GpuGovernor.policies = [
    # First match wins. Borrowed cards belong to another team's guarantee: give them back after
    # 40 idle minutes, and ask for a reason to keep them longer (once).
    {
        "name": "borrowed",
        "match": {"labels": {"gpu-gov/borrowed": "true"}},
        "warn_after": "20m",
        "cull_after": "40m",
        "max_extensions": 1,
        "extension_reason": "required",
    },
    # NVLink pairs are the scarcest tier: a shorter leash even within a guarantee.
    {
        "name": "h100-pairs",
        "match": {"tiers": ["h100x2"]},
        "warn_after": "30m",
        "cull_after": "1h",
        "extension_reason": "required",
    },
    # Small slices are plentiful: more patience for notebooks that think between cells.
    {
        "name": "small-slices",
        "match": {"tiers": ["h200-1g"]},
        "warn_after": "2h",
        "cull_after": "4h",
    },
]

# --- Hub wiring (the hub only) ----------------------------------------------------------------
if not IN_GOVERNOR:
    from jupyter_gpu_gov.hub.hubconfig import add_governor
    from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles, team_guarantees

    # Checks the tiers and quotas now (a mistake stops the hub with the entry and key named),
    # makes GpuKubeSpawner the spawner class and serves the form's memory estimate. The chart's
    # singleuser.profileList must stay empty: GpuKubeSpawner builds the profile list itself,
    # with only the tiers offered to the user's teams and what each team has left.
    add_gpu_profiles(c, spawner="kubernetes")

    # The governor as a managed service in the hub pod, with least-privilege roles; members of
    # the Hub group "gpu-admins" get its admin scope. It loads this file (see IN_GOVERNOR).
    add_governor(
        c,
        url=GOVERNOR_URL,
        args=[f"--config={THIS_FILE}"],
        # A managed service does not inherit the hub's environment: pass hub.extraEnv's
        # GPU_GOV_* settings on, since the governor reads this file too.
        environment={
            **{k: v for k, v in os.environ.items() if k.startswith("GPU_GOV_")},
            "GPU_GOV_CONFIG_FILE": THIS_FILE,
        },
        admin_groups=["gpu-admins"],
        team_quotas=team_guarantees(c),  # "My GPU usage": the guarantees of c.GpuProfiles.quotas
    )
