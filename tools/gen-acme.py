#!/usr/bin/env python3
"""Generate the ClusterState snapshot of the `acme` example fleet.

    python3 tools/gen-acme.py           # writes examples/policies/acme/state/cluster-state.yaml
    python3 tools/gen-acme.py --check   # exits 1 when the committed snapshot is stale

The policy itself (tiers, classes, pools, MIG layouts, tenants, committed workloads) is written
by hand under examples/policies/acme. This script reads it, so that the snapshot always agrees
with it, then builds the fleet (every node and GPU, MIG geometry on the inference pool) and a
realistic load: training gangs, inference replicas on MIG instances (the committed services
among them), time-sliced notebooks, and a pending queue. Before writing, it checks what the
compiler checks about a snapshot and a few invariants the compiler leaves to the solver (quota
limits at every level of the tenant tree, one trust domain per time-sliced GPU, node CPU and
memory).

Python 3.11, standard library only. A fixed seed and fixed iteration orders make the output
byte-for-byte reproducible.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path

SEED = 20261120
OBSERVED_AT = datetime(2026, 11, 20, 8, 0, 0, tzinfo=timezone.utc)

REPO = Path(__file__).resolve().parent.parent
POLICY = REPO / "examples" / "policies" / "acme"
OUTPUT = POLICY / "state" / "cluster-state.yaml"


# --------------------------------------------------------------------------------------------
# A reader for the YAML subset the hand-written policy uses: block mappings and sequences,
# flow collections, plain and quoted scalars, comments, `---` between documents. No anchors,
# no multi-line scalars. It fails loudly on anything else.


def _strip_comment(line: str) -> str:
    quote = None
    prev = " "
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'" and prev in " [{,:":
            quote = ch
        elif ch == "#" and prev in " \t":
            return line[:i].rstrip()
        prev = ch
    return line.rstrip()


def _scalar(text: str):
    if text in ("true", "false"):
        return text == "true"
    if text in ("null", "~", ""):
        return None
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    if re.fullmatch(r"-?[0-9]*\.[0-9]+", text):
        return float(text)
    return text


class _Flow:
    def __init__(self, text: str):
        self.s = text
        self.i = 0

    def ws(self):
        while self.i < len(self.s) and self.s[self.i] == " ":
            self.i += 1

    def peek(self) -> str:
        self.ws()
        if self.i >= len(self.s):
            raise ValueError(f"unexpected end of flow value: {self.s!r}")
        return self.s[self.i]

    def quoted(self) -> str:
        q = self.s[self.i]
        self.i += 1
        out = []
        while True:
            ch = self.s[self.i]
            self.i += 1
            if ch == q:
                if q == "'" and self.i < len(self.s) and self.s[self.i] == "'":
                    out.append("'")
                    self.i += 1
                    continue
                return "".join(out)
            if ch == "\\" and q == '"':
                out.append(self.s[self.i])
                self.i += 1
                continue
            out.append(ch)

    def value(self, top: bool = False):
        c = self.peek()
        if c == "{":
            return self.mapping()
        if c == "[":
            return self.sequence()
        if c in "\"'":
            return self.quoted()
        start = self.i
        if top:
            self.i = len(self.s)
        else:
            while self.i < len(self.s) and self.s[self.i] not in ",]}":
                self.i += 1
        return _scalar(self.s[start : self.i].strip())

    def mapping(self) -> dict:
        self.i += 1
        out = {}
        while True:
            if self.peek() == "}":
                self.i += 1
                return out
            if self.s[self.i] in "\"'":
                key = self.quoted()
            else:
                start = self.i
                while self.s[self.i] != ":":
                    self.i += 1
                key = self.s[start : self.i].strip()
            if self.peek() != ":":
                raise ValueError(f"expected ':' in {self.s!r}")
            self.i += 1
            out[key] = self.value()
            if self.peek() == ",":
                self.i += 1

    def sequence(self) -> list:
        self.i += 1
        out = []
        while True:
            if self.peek() == "]":
                self.i += 1
                return out
            out.append(self.value())
            if self.peek() == ",":
                self.i += 1


def _flow(text: str):
    p = _Flow(text)
    v = p.value(top=True)
    p.ws()
    if p.i != len(text):
        raise ValueError(f"trailing text in {text!r}")
    return v


def _key_split(text: str):
    if text[0] in "{[\"'":
        return None
    for i, ch in enumerate(text):
        if ch == ":" and (i + 1 == len(text) or text[i + 1] == " "):
            return text[:i].strip(), text[i + 1 :].strip()
    return None


def _is_item(text: str) -> bool:
    return text == "-" or text.startswith("- ")


def _block(lines: list, i: int, indent: int):
    if _is_item(lines[i][1]):
        out = []
        while i < len(lines) and lines[i][0] == indent and _is_item(lines[i][1]):
            rest = lines[i][1][1:].strip()
            if not rest:
                v, i = _block(lines, i + 1, lines[i + 1][0])
            elif _key_split(rest) is not None:
                lines[i] = [indent + 2, rest]
                v, i = _block(lines, i, indent + 2)
            else:
                v, i = _flow(rest), i + 1
            out.append(v)
        return out, i
    out = {}
    while i < len(lines) and lines[i][0] == indent:
        split = _key_split(lines[i][1])
        if split is None:
            raise ValueError(f"cannot read line: {lines[i][1]!r}")
        key, rest = split
        if rest:
            out[key], i = _flow(rest), i + 1
        elif i + 1 < len(lines) and lines[i + 1][0] > indent:
            out[key], i = _block(lines, i + 1, lines[i + 1][0])
        else:
            out[key], i = None, i + 1
    if i < len(lines) and lines[i][0] > indent:
        raise ValueError(f"unexpected indentation at {lines[i][1]!r}")
    return out, i


def read_yaml_documents(text: str) -> list:
    docs, cur = [], []
    for raw in text.splitlines():
        if raw.strip() == "---":
            if cur:
                docs.append(cur)
            cur = []
            continue
        line = _strip_comment(raw)
        if line.strip():
            cur.append([len(line) - len(line.lstrip(" ")), line.strip()])
    if cur:
        docs.append(cur)
    return [_block(d, 0, d[0][0])[0] for d in docs]


# --------------------------------------------------------------------------------------------
# Units and MIG geometry.

UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9}


def parse_bytes(v) -> int:
    m = re.fullmatch(r"([0-9]+)([KMGT]i?)?", str(v))
    if not m:
        raise ValueError(f"memory {v!r}")
    return int(m.group(1)) * UNITS.get(m.group(2) or "", 1)


def parse_cpu_milli(v) -> int:
    s = str(v)
    if s.endswith("m"):
        return int(s[:-1])
    return int(Fraction(s) * 1000)


def gpus(v) -> Fraction:
    """A quota value: a number of GPUs or {gpus, cpu, memory}."""
    if isinstance(v, dict):
        v = v["gpus"]
    return Fraction(str(v))


# (compute slices, memory slices, allowed starts) by profile ID, as in shared/reference/mig.md.
SHAPES = {
    19: (1, 1, range(0, 7)),
    20: (1, 1, range(0, 7)),
    15: (1, 2, (0, 2, 4, 6)),
    14: (2, 2, (0, 2, 4)),
    9: (3, 4, (0, 4)),
    5: (4, 4, (0,)),
    0: (7, 8, (0,)),
}
# Profile names of the 80 GB Ampere/Hopper models, in profile-ID order 19/20/15/14/9/5/0.
NAMES_80GB = dict(zip(
    ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    [19, 20, 15, 14, 9, 5, 0],
))
PROFILE_IDS = {"H100-SXM5-80GB": NAMES_80GB}


def place(profile_ids: list[int]):
    """An explicit placement [(profile_id, start)] for the instances, or None: backtracking over
    the allowed starts, largest first, so that a greedy dead end (balanced) is avoided."""
    order = sorted(profile_ids, key=lambda p: (-SHAPES[p][1], p))

    def go(k, used, compute, acc):
        if k == len(order):
            return acc
        p = order[k]
        c, size, starts = SHAPES[p]
        if compute + c > 7:
            return None
        for s in starts:
            mask = ((1 << size) - 1) << s
            if s + size <= 8 and not used & mask:
                r = go(k + 1, used | mask, compute + c, acc + [(p, s)])
                if r is not None:
                    return r
        return None

    r = go(0, 0, 0, [])
    return None if r is None else sorted(r, key=lambda x: x[1])


def validate_geometry(placements) -> bool:
    used, compute = 0, 0
    for p, s in placements:
        c, size, starts = SHAPES[p]
        if s not in starts:
            return False
        mask = ((1 << size) - 1) << s
        if used & mask:
            return False
        used |= mask
        compute += c
    return compute <= 7


# --------------------------------------------------------------------------------------------
# The policy, as far as the snapshot needs it.


@dataclass
class Pool:
    name: str
    model: str
    sharing: str
    nodes: int
    gpus_per_node: int
    cpu_milli: int
    memory: int
    layouts: list
    max_clients: int | None
    nodes_per_domain: int


@dataclass
class Tenant:
    name: str
    parent: str | None
    guarantee: dict
    own_limit: dict
    trust: str | None
    own_classes: list | None
    children: list = field(default_factory=list)
    limit: dict = field(default_factory=dict)
    classes: list = field(default_factory=list)
    trust_domain: str = ""

    def ancestors_and_self(self, tenants):
        t = self
        while t is not None:
            yield t
            t = tenants.get(t.parent) if t.parent else None


class Policy:
    def __init__(self, root: Path):
        docs = []
        for path in sorted(root.rglob("*.yaml")):
            if "state" in path.relative_to(root).parts:
                continue
            for d in read_yaml_documents(path.read_text()):
                docs.append(d)
        by_kind: dict[str, list] = {}
        for d in docs:
            if d.get("apiVersion") != "tessera/v1alpha1":
                raise SystemExit(f"unexpected document {d.get('metadata')}")
            by_kind.setdefault(d["kind"], []).append(d)

        self.layouts = {}
        for d in by_kind.get("MigLayout", []):
            ids = [PROFILE_IDS[d["spec"]["gpuModel"]][p] for p in d["spec"]["instances"]]
            placement = place(ids)
            if placement is None:
                raise SystemExit(f"MigLayout {d['metadata']['name']} has no placement")
            self.layouts[d["metadata"]["name"]] = placement

        self.pools = {}
        for d in by_kind["Pool"]:
            s, c = d["spec"], d["spec"]["capacity"]
            self.pools[d["metadata"]["name"]] = Pool(
                name=d["metadata"]["name"],
                model=s["gpuModel"],
                sharing=s["sharing"],
                nodes=c["nodes"],
                gpus_per_node=c["gpusPerNode"],
                cpu_milli=parse_cpu_milli(c["cpuPerNode"]),
                memory=parse_bytes(c["memoryPerNode"]),
                layouts=s.get("migLayouts") or [],
                max_clients=s.get("maxClientsPerGpu"),
                nodes_per_domain=c.get("nodesPerNvlinkDomain") or 1,
            )

        self.classes = {d["metadata"]["name"]: d["spec"] for d in by_kind["SloClass"]}

        self.tenants: dict[str, Tenant] = {}
        for d in by_kind["Tenant"]:
            s = d["spec"]
            self.tenants[d["metadata"]["name"]] = Tenant(
                name=d["metadata"]["name"],
                parent=s.get("parent"),
                guarantee={k: gpus(v) for k, v in (s.get("guarantee") or {}).items()},
                own_limit={k: gpus(v) for k, v in (s.get("limit") or {}).items()},
                trust=s.get("trustDomain"),
                own_classes=s.get("sloClasses"),
            )
        roots = [t for t in self.tenants.values() if t.parent is None]
        assert len(roots) == 1, "exactly one root tenant"
        self.root = roots[0]
        for t in sorted(self.tenants.values(), key=lambda t: t.name):
            if t.parent:
                self.tenants[t.parent].children.append(t.name)
        self._resolve(self.root, None)

        self.workloads = [
            (d["metadata"]["name"], d["spec"]) for d in by_kind.get("Workload", [])
        ]

    def _resolve(self, t: Tenant, parent: Tenant | None):
        for p, pool in self.pools.items():
            inherited = parent.limit[p] if parent else Fraction(pool.nodes * pool.gpus_per_node)
            t.limit[p] = t.own_limit.get(p, inherited)
        t.classes = t.own_classes or (parent.classes if parent else sorted(self.classes))
        t.trust_domain = t.trust or (parent.trust_domain if parent else t.name)
        for c in t.children:
            self._resolve(self.tenants[c], t)

    def leaves(self):
        return [t for t in sorted(self.tenants.values(), key=lambda t: t.name) if not t.children]


# --------------------------------------------------------------------------------------------
# The fleet.


def uuid_of(prefix: str, key: str) -> str:
    h = hashlib.sha256(f"acme/{key}".encode()).hexdigest()
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass
class Gpu:
    node: "Node"
    index: int
    health: str = "healthy"
    mig_enabled: bool = False
    mig_pending: bool | None = None
    instances: list = field(default_factory=list)  # [(profile_id, start)]
    whole: str | None = None  # workload holding it
    held: dict = field(default_factory=dict)  # MIG start -> workload
    shares: list = field(default_factory=list)  # [(workload, Fraction, trust domain)]
    layout: str | None = None

    @property
    def usable(self) -> bool:
        return self.health == "healthy" and self.node.health == "healthy"

    @property
    def free_for_whole(self) -> bool:
        return self.usable and self.whole is None


@dataclass
class Node:
    name: str
    pool: Pool
    rack: str
    nvlink_domain: str | None
    labels: dict
    health: str = "healthy"
    gpus: list = field(default_factory=list)
    cpu_used: int = 0
    mem_used: int = 0

    def fits(self, cpu_milli: int, mem: int) -> bool:
        return self.cpu_used + cpu_milli <= self.pool.cpu_milli and self.mem_used + mem <= self.pool.memory


GPU_PRODUCT = {"H100-SXM5-80GB": "NVIDIA-H100-80GB-HBM3", "L40S-48GB": "NVIDIA-L40S"}

# What happened to the fleet lately: a few GPUs and nodes are not healthy, and the inference
# pool is mid-way through some re-partitioning.
INCIDENTS = {
    ("h100-train-057", None): "degraded",
    ("h100-train-057", 3): "lost",  # XID 79, fallen off the bus
    ("h100-train-203", 6): "degraded",  # row-remapping pending
    ("h100-train-388", None): "lost",  # node unreachable since the last power event
    ("h100-infer-07", 0): "degraded",
    ("l40s-dev-13", None): "degraded",
    ("l40s-dev-13", 2): "lost",
}
MIG_MODE_PENDING = {("h100-infer-23", 5)}  # an RMA replacement: MIG mode set, reset pending
DRAINED = {("h100-infer-41", 2), ("h100-infer-41", 3)}  # emptied for a new geometry

# Share of the inference pool's GPUs per layout. The index-major assignment below gives every
# node a mix, so that a service's replicas spread over nodes.
INFER_LAYOUT_COUNTS = [("all-7g", 64), ("halves", 80), ("balanced", 160), ("twos", 48), ("all-1g", 160)]


def build_fleet(policy: Policy):
    nodes: list[Node] = []
    train = policy.pools["h100-train"]
    infer = policy.pools["h100-infer"]
    dev = policy.pools["l40s-dev"]

    def labels(pool):
        return {"tessera/pool": pool.name, "nvidia.com/gpu.product": GPU_PRODUCT[pool.model]}

    for n in range(1, train.nodes + 1):
        d = (n - 1) // train.nodes_per_domain + 1
        nodes.append(Node(f"h100-train-{n:03d}", train, f"dc2-r{d:03d}", f"nvl-{d:03d}", labels(train)))
    for n in range(1, infer.nodes + 1):
        nodes.append(Node(f"h100-infer-{n:02d}", infer, f"dc2-i{(n - 1) // 4 + 1:02d}", None, labels(infer)))
    for n in range(1, dev.nodes + 1):
        nodes.append(Node(f"l40s-dev-{n:02d}", dev, f"dc1-d{(n - 1) // 8 + 1:02d}", None, labels(dev)))

    layout_seq = [name for name, count in INFER_LAYOUT_COUNTS for _ in range(count)]
    assert len(layout_seq) == infer.nodes * infer.gpus_per_node
    infer_nodes = [n for n in nodes if n.pool is infer]
    for node in nodes:
        node.health = INCIDENTS.get((node.name, None), "healthy")
        for i in range(node.pool.gpus_per_node):
            g = Gpu(node, i, health=INCIDENTS.get((node.name, i), "healthy"))
            if node.health == "lost":
                g.health = "lost"
            if node.pool is infer:
                k = infer_nodes.index(node)
                g.layout = layout_seq[i * infer.nodes + k]
                assert g.layout in infer.layouts
                if (node.name, i) in MIG_MODE_PENDING:
                    g.mig_enabled, g.mig_pending, g.layout = False, True, None
                elif (node.name, i) in DRAINED:
                    g.mig_enabled, g.layout = True, None
                else:
                    g.mig_enabled = True
                    g.instances = list(policy.layouts[g.layout])
            node.gpus.append(g)
    return nodes


# --------------------------------------------------------------------------------------------
# Load.


@dataclass
class Workload:
    name: str
    spec: dict  # in document order, as it is written out
    bindings: list = field(default_factory=list)  # dicts, in document order
    started_at: datetime | None = None
    checkpoint_at: datetime | None = None
    submitted_at: datetime | None = None
    section: str = ""

    @property
    def tenant(self) -> str:
        return self.spec["tenant"]


def ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class Names:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def reserve(self, name: str) -> str:
        assert name not in self.used, name
        self.used.add(name)
        return name

    def fresh(self, stem: str) -> str:
        while True:
            name = f"{stem}-{self.rng.getrandbits(16):04x}"
            if name not in self.used:
                self.used.add(name)
                return name


# MIG profile -> (cpu cores, memory Gi) of a replica: what our serving images ask for. Chosen so
# that no layout can overcommit a node's CPU or memory.
MIG_REPLICA = {19: (3, 24), 14: (6, 48), 9: (8, 96), 5: (12, 128), 0: (24, 200)}
ID_TO_NAME = {v: k for k, v in NAMES_80GB.items()}
COMPUTE = {p: SHAPES[p][0] for p in SHAPES}

# Inference deployments submitted at run time (model-serving platform): per tenant, the models
# it serves with their MIG profile, and the GPU it aims to use in all (committed services
# included). The regions are the deployments' suffixes.
INFER_MODELS = {
    "search-ranking": (74, [("reranker-v8-canary", "2g.20gb"), ("reranker-v7-eu", "2g.20gb"),
                            ("spell-fix", "1g.10gb"), ("intent-classifier", "1g.10gb"),
                            ("query-expansion", "3g.40gb"), ("snippet-gen", "3g.40gb"),
                            ("ltr-shadow", "1g.10gb")]),
    "search-embeddings": (48, [("embed-v5-canary", "1g.10gb"), ("image-embed", "2g.20gb"),
                               ("code-embed", "1g.10gb"), ("multilingual-embed", "1g.10gb"),
                               ("embed-v5-large", "3g.40gb")]),
    "assistant-chat": (136, [("chat-8b-canary", "3g.40gb"), ("chat-32b-canary", "7g.80gb"),
                             ("router", "1g.10gb"), ("summarizer", "2g.20gb"),
                             ("title-gen", "1g.10gb"), ("tool-caller", "4g.40gb"),
                             ("memory-extractor", "2g.20gb"), ("chat-8b-longctx", "4g.40gb"),
                             ("chat-32b-eu", "7g.80gb")]),
    "assistant-voice": (40, [("asr-small", "1g.10gb"), ("tts-v3-canary", "2g.20gb"),
                             ("voice-activity", "1g.10gb"), ("diarizer", "1g.10gb"),
                             ("speech-translate", "3g.40gb")]),
    "ads-ctr": (28, [("ctr-v12-canary", "1g.10gb"), ("cvr-model", "1g.10gb"),
                     ("bid-shading", "1g.10gb"), ("fraud-scorer", "2g.20gb")]),
    "ads-creative": (11, [("creative-ranker", "2g.20gb"), ("image-upscaler", "3g.40gb"),
                          ("copy-gen", "4g.40gb")]),
    "code-completion": (38, [("complete-14b-canary", "4g.40gb"), ("complete-3b-fast", "2g.20gb"),
                             ("fim-7b", "3g.40gb"), ("next-edit", "3g.40gb")]),
    "infra-ci": (5, [("ci-serving-smoke", "1g.10gb")]),
    "infra-benchmarks": (7, [("bench-serving-latency", "3g.40gb"), ("bench-mig-interference", "1g.10gb")]),
}
REGIONS = ["us-east", "us-west", "us-central", "eu-west", "eu-central", "ap-south", "ap-northeast"]
# Debugging sessions on MIG slices, in the interactive class.
INFER_DEBUG = {"assistant-finetune": 5, "assistant-chat": 2}

USERS = [
    "akumar", "jchen", "mgarcia", "sokafor", "lnguyen", "pschmidt", "rsingh", "tyamamoto",
    "bcohen", "eivanova", "dmartin", "fahmed", "grossi", "hkim", "iberg", "jlopez", "kwang",
    "lmuller", "mnovak", "npatel", "orahman", "pduarte", "qzhou", "rsato", "sfischer",
    "tjohnson", "uadeyemi", "vpetrov", "wli", "xmoreau", "ybrown", "zhusain", "amehta",
    "bsilva", "cdubois", "dkowalski", "eosei", "fnakamura", "gwilliams", "hlarsen",
]

# Training submitted at run time: per tenant, the GPUs it aims to use, its big runs (GPUs), the
# share of the rest in multi-node gangs (the remainder in small jobs), and name stems.
TRAINING = {
    "nlp-pretrain": (704, [512, 128], 1.0, ["llm-70b", "llm-34b", "llm-8b-ablation", "moe-16x3b"]),
    "nlp-posttrain": (240, [], 0.3, ["sft", "dpo", "reward-model", "long-context"]),
    "nlp-eval": (150, [], 0.0, ["eval-harness", "eval-longbench", "eval-code", "contamination-scan"]),
    "vision-diffusion": (300, [128], 0.3, ["dit-xl", "vae", "upscaler", "controlnet"]),
    "vision-video": (240, [128], 0.3, ["video-dit", "video-tokenizer", "frame-interp"]),
    "vision-eval": (100, [], 0.0, ["fid-sweep", "clip-score", "pref-model"]),
    "mm-pretrain": (352, [256], 0.3, ["vlm-34b", "vlm-8b", "audio-encoder"]),
    "mm-agents": (56, [], 0.3, ["agent-sft", "web-agent-rl", "tool-use-eval"]),
    "rl-reasoning": (220, [], 0.3, ["grpo-math", "ppo-code", "verifier", "prm"]),
    "rl-robotics": (30, [], 0.0, ["sim2real", "policy-distill"]),
    "alignment-evals": (80, [], 0.3, ["redteam-eval", "refusal-eval", "jailbreak-sweep"]),
    "alignment-interp": (40, [], 0.0, ["sae-train", "probe-sweep", "activation-patching"]),
    "search-ranking": (48, [], 0.3, ["reranker-distill", "ltr-train"]),
    "search-embeddings": (24, [], 0.3, ["embed-contrastive", "hard-negatives"]),
    "assistant-voice": (16, [], 0.3, ["asr-finetune", "tts-finetune"]),
    "assistant-finetune": (260, [64], 0.3, ["chat-sft", "chat-dpo", "tool-sft", "safety-sft"]),
    "ads-ctr": (56, [], 0.3, ["ctr-dlrm", "cvr-train"]),
    "ads-creative": (16, [], 0.3, ["creative-lora", "copy-sft"]),
    "code-completion": (16, [], 0.3, ["fim-sft", "next-edit-train"]),
    "code-review": (24, [], 0.3, ["review-sft", "review-rm"]),
    "infra-ci": (60, [], 0.0, ["ci-gpu-tests", "ci-nccl-smoke", "ci-kernel-tests"]),
    "infra-benchmarks": (64, [], 1.0, ["bench-nccl-allreduce", "bench-mlperf-llm", "bench-fp8-gemm"]),
    "data-curation": (80, [], 0.3, ["dedup-minhash", "quality-classifier", "pii-filter", "caption-gen"]),
    "data-labeling": (8, [], 0.0, ["prelabel", "label-model"]),
}

# Development sessions on time-sliced L40S: (kind, fraction, cpu, memory Gi, weight).
DEV_KINDS = [("jupyter", Fraction(1, 4), 3, 24, 40), ("vscode", Fraction(1, 2), 6, 48, 3),
             ("demo", Fraction(1), 12, 96, 1)]

PENDING = {"training": 124, "inference": 38, "development": 38}


class Generator:
    def __init__(self, policy: Policy):
        self.p = policy
        self.rng = random.Random(SEED)
        self.names = Names(self.rng)
        self.nodes = build_fleet(policy)
        self.by_pool = {name: [n for n in self.nodes if n.pool.name == name] for name in policy.pools}
        self.usage = {(t, p): Fraction(0) for t in policy.tenants for p in policy.pools}
        self.running: list[Workload] = []
        self.pending: list[Workload] = []

    # --- quota -------------------------------------------------------------------------------

    def within_limits(self, tenant: str, pool: str, amount: Fraction) -> bool:
        t = self.p.tenants[tenant]
        return all(self.usage[(a.name, pool)] + amount <= a.limit[pool]
                   for a in t.ancestors_and_self(self.p.tenants))

    def charge(self, tenant: str, pool: str, amount: Fraction):
        for a in self.p.tenants[tenant].ancestors_and_self(self.p.tenants):
            self.usage[(a.name, pool)] += amount

    # --- times -------------------------------------------------------------------------------

    def ago(self, lo_minutes: int, hi_minutes: int) -> datetime:
        return OBSERVED_AT - timedelta(seconds=self.rng.randint(lo_minutes * 60, hi_minutes * 60))

    # --- inference ---------------------------------------------------------------------------

    def free_instances(self):
        """Free MIG instances by profile, ordered index-major so that consecutive picks land on
        different nodes (replicas of a service spread over failure domains)."""
        free: dict[int, list] = {}
        infer_nodes = self.by_pool["h100-infer"]
        for i in range(8):
            for node in infer_nodes:
                g = node.gpus[i]
                if not g.usable:
                    continue
                for pid, start in g.instances:
                    if start not in g.held:
                        free.setdefault(pid, []).append((g, start))
        return free

    def bind_mig(self, w: Workload, pid: int, replicas: int, free) -> bool:
        cand = [(g, s) for g, s in free.get(pid, []) if s not in g.held]
        chosen, nodes_used = [], {}
        for g, s in cand:
            if len(chosen) == replicas:
                break
            # At most a quarter of a service's replicas on one node.
            cap = max(1, replicas // 4)
            if nodes_used.get(g.node.name, 0) >= cap:
                continue
            if not g.node.fits(parse_cpu_milli(w.spec["cpu"]), parse_bytes(w.spec["memory"])):
                continue
            chosen.append((g, s))
            nodes_used[g.node.name] = nodes_used.get(g.node.name, 0) + 1
        if len(chosen) < replicas:
            return False
        for g, s in chosen:
            g.held[s] = w.name
            g.node.cpu_used += parse_cpu_milli(w.spec["cpu"])
            g.node.mem_used += parse_bytes(w.spec["memory"])
            w.bindings.append({"node": g.node.name, "gpus": [g.index], "migStart": s})
        free[pid] = [(g, s) for g, s in free[pid] if s not in g.held]
        return True

    def inference(self):
        free = self.free_instances()
        # The committed services first, exactly as Git describes them.
        for name, spec in self.p.workloads:
            pid = NAMES_80GB[spec["gpu"]["migProfile"]]
            cpu, mem = MIG_REPLICA[pid]
            assert parse_cpu_milli(spec["cpu"]) <= cpu * 1000, name
            assert parse_bytes(spec["memory"]) <= mem * 2**30, name
            w = Workload(self.names.reserve(name), dict(spec), section="committed")
            amount = Fraction(COMPUTE[pid], 7) * spec["replicas"]
            assert self.within_limits(spec["tenant"], "h100-infer", amount), name
            assert self.bind_mig(w, pid, spec["replicas"], free), f"no room for {name}"
            self.charge(spec["tenant"], "h100-infer", amount)
            w.started_at = self.ago(60 * 24 * 3, 60 * 24 * 20)
            self.running.append(w)

        # Then deployments from the serving platform, tenant by tenant, in rounds so that no
        # tenant takes the scarce profiles before the others had a turn.
        active = {t: target for t, (target, _) in INFER_MODELS.items()}
        misses = {t: 0 for t in active}
        while active:
            for tenant in sorted(active):
                target = active[tenant]
                models = INFER_MODELS[tenant][1]
                # Prefer profiles that still have many free instances.
                weights = [len(free.get(NAMES_80GB[p], [])) for _, p in models]
                if sum(weights) == 0:
                    del active[tenant]
                    continue
                model, profile = self.rng.choices(models, weights)[0]
                pid = NAMES_80GB[profile]
                replicas = self.rng.choice({19: [1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3], 14: [1, 1, 1, 1, 1, 2],
                                            9: [1, 1, 1, 2], 5: [1, 1, 2], 0: [1, 1, 2]}[pid])
                amount = Fraction(COMPUTE[pid], 7) * replicas
                used = self.usage[(tenant, "h100-infer")]
                if used + amount > target or not self.within_limits(tenant, "h100-infer", amount):
                    del active[tenant]
                    continue
                cpu, mem = MIG_REPLICA[pid]
                cpu = self.rng.choice([c for c in (1, 2, 3, 4, 6, 8, 12, 16, 24) if c <= cpu])
                spec = {"tenant": tenant, "sloClass": "latency-critical", "pool": "h100-infer",
                        "replicas": replicas}
                if replicas > 2:
                    spec["minMember"] = (replicas + 1) // 2
                mem = self.rng.choice([m for m in (8, 16, 24, 32, 48, 64, 96, 128, 200) if m <= mem])
                spec.update({"gpu": {"migProfile": profile}, "cpu": cpu, "memory": f"{mem}Gi"})
                region = self.rng.choice(REGIONS)
                w = Workload(self.names.fresh(f"{model}-{region}"), spec, section="serving")
                if not self.bind_mig(w, pid, replicas, free):
                    self.names.used.discard(w.name)
                    misses[tenant] += 1
                    if misses[tenant] >= 20:
                        del active[tenant]
                    continue
                self.charge(tenant, "h100-infer", amount)
                w.started_at = self.ago(30, 60 * 24 * 14)
                self.running.append(w)

        # Debugging sessions on small slices, preemptible.
        for tenant, count in sorted(INFER_DEBUG.items()):
            for _ in range(count):
                profile = self.rng.choice(["1g.10gb", "1g.10gb", "2g.20gb"])
                pid = NAMES_80GB[profile]
                amount = Fraction(COMPUTE[pid], 7)
                if not self.within_limits(tenant, "h100-infer", amount):
                    continue
                cpu, mem = MIG_REPLICA[pid]
                spec = {"tenant": tenant, "sloClass": "interactive", "pool": "h100-infer",
                        "gpu": {"migProfile": profile}, "cpu": cpu, "memory": f"{mem}Gi",
                        "maxDuration": "8h"}
                w = Workload(self.names.fresh(f"debug-{self.rng.choice(USERS)}"), spec, section="serving")
                if self.bind_mig(w, pid, 1, free):
                    self.charge(tenant, "h100-infer", amount)
                    w.started_at = self.ago(10, 60 * 6)
                    self.running.append(w)

    # --- training ----------------------------------------------------------------------------

    def training_jobs(self):
        """Every training job the tenants want to run, as specs; placed (or queued) later."""
        jobs = []
        for tenant, (target, big, gang_share, stems) in TRAINING.items():
            planned = Fraction(0)

            def add(replicas, count, topology=None, min_member=None, duration=None):
                nonlocal planned
                total = replicas * count
                spec = {"tenant": tenant, "sloClass": "batch-training"}
                if self.rng.random() < 0.5:
                    spec["pool"] = "h100-train"
                spec["replicas"] = replicas
                if min_member is not None:
                    spec["minMember"] = min_member
                per_gpu_cpu = self.rng.choice([16, 20, 24])
                per_gpu_mem = self.rng.choice([160, 200, 220])
                spec["gpu"] = {"count": count}
                spec["cpu"] = per_gpu_cpu * count
                spec["memory"] = f"{per_gpu_mem * count}Gi"
                if topology:
                    spec["topology"] = {"sameNvlinkDomain": topology}
                if duration:
                    spec["maxDuration"] = duration
                stem = self.rng.choice(stems)
                if count == 8:
                    spec["command"] = ["torchrun", f"--nnodes={replicas}", "--nproc-per-node=8",
                                       "-m", "acme.train", f"--config=configs/{stem}.yaml"]
                    spec["env"] = {"NCCL_IB_HCA": "mlx5", "ACME_CKPT_DIR": f"/ckpt/{tenant}/{stem}"}
                jobs.append((tenant, stem, spec))
                planned += total

            for size in big:
                add(size // 8, 8, topology="preferred", duration="336h")
            gang_budget = (target - planned) * Fraction(gang_share).limit_denominator(10)
            while planned < target:
                left = target - planned
                if gang_budget > 0 and left >= 8:
                    size = self.rng.choice([s for s in (8, 16, 16, 32, 32, 64) if s <= max(8, left)])
                    # Up to one rack (32 GPUs) tensor parallelism is pinned to an NVLink domain.
                    topology = "required" if size <= 32 and self.rng.random() < 0.6 else "preferred"
                    add(size // 8, 8, topology=topology, duration=self.rng.choice([None, "72h", "168h"]))
                    gang_budget -= size
                else:
                    # Most jobs are small (one-GPU evals and sweep trials), though most
                    # GPU-hours go to the gangs.
                    count = self.rng.choice([1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 4, 8])
                    replicas = self.rng.choice([1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4])
                    while count * replicas > left and (count > 1 or replicas > 1):
                        if replicas > 1:
                            replicas //= 2
                        else:
                            count //= 2
                    mm = 1 if replicas > 1 and self.rng.random() < 0.5 else None
                    add(replicas, count, min_member=mm,
                        duration=self.rng.choice(["1h", "2h", "6h", "12h", None]))
        return jobs

    def place_training(self, spec) -> list | None:
        """Bindings for a training job, or None when it does not fit now."""
        nodes = self.by_pool["h100-train"]
        count, replicas = spec["gpu"]["count"], spec["replicas"]
        cpu, mem = parse_cpu_milli(spec["cpu"]), parse_bytes(spec["memory"])

        def empty(n: Node):
            return n.health == "healthy" and all(g.free_for_whole for g in n.gpus)

        if count == 8:
            per = nodes[0].pool.nodes_per_domain
            domains = [nodes[i : i + per] for i in range(0, len(nodes), per)]
            if spec.get("topology", {}).get("sameNvlinkDomain") == "required":
                fitting = [d for d in domains if sum(map(empty, d)) >= replicas]
                if not fitting:
                    return None
                # Best fit: the domain with the fewest empty nodes that still holds the gang.
                domain = min(fitting, key=lambda d: sum(map(empty, d)))
                picked = [n for n in domain if empty(n)][:replicas]
            else:
                # Whole domains first, so that gangs stay compact and racks fill up.
                order = sorted(domains, key=lambda d: -sum(map(empty, d)))
                picked = [n for d in order for n in d if empty(n)][:replicas]
                if len(picked) < replicas:
                    return None
            return [(n, list(range(8))) for n in picked]

        out = []
        taken: dict[str, set] = {}
        for _ in range(replicas):
            eligible = []
            for n in nodes:
                if n.health != "healthy" or not n.fits(cpu, mem):
                    continue
                free = [g.index for g in n.gpus if g.free_for_whole and g.index not in taken.get(n.name, set())]
                if len(free) >= count:
                    eligible.append((n, free))
            # Like kube-scheduler, score a sample of the feasible nodes rather than all of them;
            # best fit within the sample. The sample is why a few GPUs end up stranded.
            if len(eligible) > 24:
                eligible = self.rng.sample(eligible, 24)
            best = None
            for n, free in eligible:
                key = (len(free) == 8, len(free), n.name)
                if best is None or key < best[0]:
                    best = (key, n, free)
            if best is None:
                return None
            _, n, free = best
            block = None
            for start in range(0, 8, count):
                want = list(range(start, start + count))
                if all(i in free for i in want):
                    block = want
                    break
            block = block or free[:count]
            taken.setdefault(n.name, set()).update(block)
            out.append((n, block))
        return out

    def training(self):
        jobs = self.training_jobs()
        # The long runs (64 GPUs and more) were admitted first, days ago; everything else in the
        # order it happened to arrive, which is how small jobs come to strand GPUs on nodes a
        # gang would need whole.
        size = {k: jobs[k][2]["replicas"] * jobs[k][2]["gpu"]["count"] for k in range(len(jobs))}
        arrival = {k: self.rng.random() for k in range(len(jobs))}
        order = sorted(range(len(jobs)), key=lambda k: (-size[k] if size[k] >= 64 else 0, arrival[k]))
        for k in order:
            tenant, stem, spec = jobs[k]
            total = Fraction(spec["replicas"] * spec["gpu"]["count"])
            placed = self.within_limits(tenant, "h100-train", total) and self.place_training(spec)
            if not placed:
                self.pending.append(self.queued(stem, spec))
                continue
            w = Workload(self.names.fresh(stem), spec, section="training")
            for n, block in placed:
                for i in block:
                    n.gpus[i].whole = w.name
                n.cpu_used += parse_cpu_milli(spec["cpu"])
                n.mem_used += parse_bytes(spec["memory"])
                w.bindings.append({"node": n.name, "gpus": block})
            self.charge(tenant, "h100-train", total)
            big = total >= 64
            w.started_at = self.ago(60, 60 * 24 * (10 if big else 2))
            age = (OBSERVED_AT - w.started_at).total_seconds() / 60
            if age > 45:
                w.checkpoint_at = self.ago(1, min(int(age) - 30, 120))
            self.running.append(w)

    def queued(self, stem: str, spec: dict) -> Workload:
        w = Workload(self.names.fresh(stem), spec, section="pending")
        w.submitted_at = self.ago(2, 60 * 8)
        return w

    # --- development -------------------------------------------------------------------------

    def development(self):
        gpus_all = [g for n in self.by_pool["l40s-dev"] for g in n.gpus]
        max_clients = self.p.pools["l40s-dev"].max_clients
        users = {}
        for t in self.p.leaves():
            if "interactive" not in t.classes or t.limit["l40s-dev"] == 0:
                continue
            target = t.guarantee.get("l40s-dev", Fraction(0)) * Fraction(self.rng.randint(80, 115), 100)
            target += Fraction(self.rng.choice([0, 0, 1, 2]), 4)
            users[t.name] = target
        active = dict(users)
        while active:
            for tenant in sorted(active):
                kind, frac, cpu, mem, _ = self.rng.choices(DEV_KINDS, [k[4] for k in DEV_KINDS])[0]
                if self.usage[(tenant, "l40s-dev")] + frac > active[tenant] or \
                        not self.within_limits(tenant, "l40s-dev", frac):
                    del active[tenant]
                    continue
                trust = self.p.tenants[tenant].trust_domain
                gpu = None
                # A GPU already time-sliced by this trust domain, else an idle one.
                for g in gpus_all:
                    if not g.usable or not g.node.fits(cpu * 1000, mem * 2**30):
                        continue
                    if g.shares and g.shares[0][2] == trust and len(g.shares) < max_clients \
                            and sum(s[1] for s in g.shares) + frac <= 1:
                        gpu = g
                        break
                if gpu is None:
                    idle = [g for g in gpus_all if g.usable and not g.shares and g.node.fits(cpu * 1000, mem * 2**30)]
                    if not idle:
                        del active[tenant]
                        continue
                    gpu = self.rng.choice(idle)
                user = self.rng.choice(USERS)
                spec = {"tenant": tenant, "sloClass": "interactive"}
                if self.rng.random() < 0.7:
                    spec["pool"] = "l40s-dev"
                spec.update({"gpu": {"fraction": float(frac)}, "cpu": cpu, "memory": f"{mem}Gi",
                             "maxDuration": self.rng.choice(["8h", "12h", "24h"])})
                w = Workload(self.names.fresh(f"{kind}-{user}"), spec, section="development")
                gpu.shares.append((w.name, frac, trust))
                gpu.node.cpu_used += cpu * 1000
                gpu.node.mem_used += mem * 2**30
                w.bindings.append({"node": gpu.node.name, "gpus": [gpu.index], "share": float(frac)})
                self.charge(tenant, "l40s-dev", frac)
                w.started_at = self.ago(5, 60 * 20)
                self.running.append(w)

    # --- the queue ---------------------------------------------------------------------------

    def queue(self):
        # Training: jobs that did not fit when generated are queued already; top up with new
        # submissions, mostly gangs waiting for whole racks.
        tenants = list(TRAINING)
        while sum(1 for w in self.pending if w.spec["sloClass"] == "batch-training") < PENDING["training"]:
            tenant = self.rng.choice(tenants)
            stems = TRAINING[tenant][3]
            t = self.p.tenants[tenant]
            size = self.rng.choice([1, 2, 4, 8, 8, 16, 32, 32, 64, 128, 256])
            if size > t.limit["h100-train"]:
                continue
            spec = {"tenant": tenant, "sloClass": "batch-training"}
            if size >= 8:
                spec.update({"replicas": size // 8, "gpu": {"count": 8}, "cpu": 192, "memory": "1760Gi"})
                if size <= 32:
                    spec["topology"] = {"sameNvlinkDomain": "required"}
                elif size >= 64:
                    spec["topology"] = {"sameNvlinkDomain": "preferred"}
            else:
                spec.update({"replicas": 1, "gpu": {"count": size}, "cpu": 24 * size,
                             "memory": f"{200 * size}Gi", "maxDuration": "4h"})
            self.pending.append(self.queued(self.rng.choice(stems), spec))

        # Inference: new deployments, mostly of the large profiles (waiting for a re-partition).
        serving = sorted(INFER_MODELS)
        for _ in range(PENDING["inference"]):
            tenant = self.rng.choice(serving)
            models = INFER_MODELS[tenant][1]
            big = [m for m in models if m[1] in ("3g.40gb", "4g.40gb", "7g.80gb")]
            model, profile = self.rng.choice(big or models)
            pid = NAMES_80GB[profile]
            cpu, mem = MIG_REPLICA[pid]
            replicas = self.rng.choice([2, 4, 8])
            while Fraction(COMPUTE[pid] * replicas, 7) > self.p.tenants[tenant].limit["h100-infer"]:
                replicas //= 2
            spec = {"tenant": tenant, "sloClass": "latency-critical", "pool": "h100-infer",
                    "replicas": replicas, "minMember": max(1, replicas // 2),
                    "gpu": {"migProfile": profile}, "cpu": cpu, "memory": f"{mem}Gi"}
            region = self.rng.choice(REGIONS)
            self.pending.append(self.queued(f"{model}-{region}", spec))

        # Development: notebooks of teams whose time-sliced GPUs are full.
        dev_tenants = [t.name for t in self.p.leaves()
                       if "interactive" in t.classes and t.limit["l40s-dev"] > 0]
        for _ in range(PENDING["development"]):
            tenant = self.rng.choice(dev_tenants)
            kind, frac, cpu, mem, _ = self.rng.choices(DEV_KINDS, [k[4] for k in DEV_KINDS])[0]
            spec = {"tenant": tenant, "sloClass": "interactive",
                    "gpu": {"fraction": float(frac)}, "cpu": cpu, "memory": f"{mem}Gi", "maxDuration": "8h"}
            self.pending.append(self.queued(f"{kind}-{self.rng.choice(USERS)}", spec))
        self.pending.sort(key=lambda w: (w.submitted_at, w.name))

    def run(self):
        self.inference()
        self.training()
        self.development()
        self.queue()
        self.check()

    # --- self-check --------------------------------------------------------------------------

    def check(self):
        p = self.p
        seen = set()
        for w in self.running + self.pending:
            assert w.name not in seen and re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", w.name), w.name
            seen.add(w.name)
            t = p.tenants[w.spec["tenant"]]
            assert w.spec["sloClass"] in t.classes, (w.name, t.name)
            g = w.spec["gpu"]
            assert len(g) == 1
            assert w.spec.get("minMember", 1) <= w.spec.get("replicas", 1)
        # Bindings against the fleet, from scratch.
        gpu_at = {(n.name, g.index): g for n in self.nodes for g in n.gpus}
        held_whole, held_mig, shares = {}, {}, {}
        used = {(t, pl): Fraction(0) for t in p.tenants for pl in p.pools}
        node_cpu, node_mem = {}, {}
        for w in self.running:
            s = w.spec
            assert len(w.bindings) == s.get("replicas", 1), w.name
            t = p.tenants[s["tenant"]]
            cls = p.classes[s["sloClass"]]
            pools = set()
            for b in w.bindings:
                gs = [gpu_at[(b["node"], i)] for i in b["gpus"]]
                pool = gs[0].node.pool
                pools.add(pool.name)
                order = ["timeslice", "mps", "mig", "exclusive"]
                assert order.index(pool.sharing) >= order.index(cls["isolation"]["minimum"]), w.name
                for g in gs:
                    assert g.usable, (w.name, b)
                node_cpu[b["node"]] = node_cpu.get(b["node"], 0) + parse_cpu_milli(s["cpu"])
                node_mem[b["node"]] = node_mem.get(b["node"], 0) + parse_bytes(s["memory"])
                if "count" in s["gpu"]:
                    assert len(gs) == s["gpu"]["count"] and pool.sharing == "exclusive"
                    for g in gs:
                        key = (b["node"], g.index)
                        assert key not in held_whole, (w.name, key)
                        held_whole[key] = w.name
                    used[(t.name, pool.name)] += len(gs)
                elif "migProfile" in s["gpu"]:
                    (g,) = gs
                    pid = NAMES_80GB[s["gpu"]["migProfile"]]
                    assert (pid, b["migStart"]) in g.instances and g.mig_enabled, (w.name, b)
                    key = (b["node"], g.index, b["migStart"])
                    assert key not in held_mig, (w.name, key)
                    held_mig[key] = w.name
                    used[(t.name, pool.name)] += Fraction(COMPUTE[pid], 7)
                else:
                    (g,) = gs
                    frac = Fraction(str(s["gpu"]["fraction"]))
                    assert Fraction(str(b["share"])) == frac and pool.sharing in ("mps", "timeslice")
                    shares.setdefault((b["node"], g.index), []).append((frac, t.trust_domain))
                    used[(t.name, pool.name)] += frac
            assert len(pools) == 1, w.name
            if s["gpu"].get("count") and s.get("topology", {}).get("sameNvlinkDomain") == "required":
                domains = {next(n for n in self.nodes if n.name == b["node"]).nvlink_domain or b["node"]
                           for b in w.bindings}
                assert len(domains) == 1, w.name
        for key, sh in shares.items():
            pool = gpu_at[key].node.pool
            assert sum(f for f, _ in sh) <= 1 and len(sh) <= pool.max_clients, key
            assert len({d for _, d in sh}) == 1, f"two trust domains share {key}"
        for n in self.nodes:
            assert node_cpu.get(n.name, 0) <= n.pool.cpu_milli, n.name
            assert node_mem.get(n.name, 0) <= n.pool.memory, n.name
            for g in n.gpus:
                assert validate_geometry(g.instances), (n.name, g.index)
                assert not g.instances or g.mig_enabled
        # Quota: usage (rolled up) never above the effective limit at any level.
        rolled = dict(used)
        for (tname, pl), amount in used.items():
            t = p.tenants[tname]
            for a in t.ancestors_and_self(p.tenants):
                if a is not t:
                    rolled[(a.name, pl)] += amount
        for (tname, pl), amount in rolled.items():
            assert amount <= p.tenants[tname].limit[pl], (tname, pl, amount)
        self.used = rolled

    # --- output ------------------------------------------------------------------------------

    def render(self) -> str:
        out: list[str] = []
        w = out.append
        infer_gpus = [g for n in self.by_pool["h100-infer"] for g in n.gpus]
        infer_free = sum(1 for g in infer_gpus for _, s in g.instances if s not in g.held)
        infer_all = sum(len(g.instances) for n in self.by_pool["h100-infer"] for g in n.gpus)
        train_busy = sum(1 for n in self.by_pool["h100-train"] for g in n.gpus if g.whole)
        dev_busy = sum(sum(s[1] for s in g.shares) for n in self.by_pool["l40s-dev"] for g in n.gpus)
        sections = {}
        for x in self.running:
            sections[x.section] = sections.get(x.section, 0) + 1
        w("# GENERATED FILE: do not edit. Written by tools/gen-acme.py from the hand-written policy in")
        w("# examples/policies/acme; regenerate with `python3 tools/gen-acme.py` after changing either.")
        w("#")
        pools = self.p.pools.values()
        w(f"# A snapshot of the acme fleet as the reconciler exports it: {len(self.nodes)} nodes")
        w("# (" + ", ".join(f"{p.name} {p.nodes}" for p in pools) + "), a few unhealthy GPUs,")
        w("# the inference pool under MIG mid-way through some re-partitioning, and the load at")
        w("# 08:00 UTC on a weekday:")
        w(f"#   h100-train  {train_busy} of {self.p.pools['h100-train'].nodes * 8} GPUs held by training")
        w(f"#   h100-infer  {infer_all - infer_free} of {infer_all} MIG instances held "
          f"({float(self.used[('acme', 'h100-infer')]):.1f} GPUs of 512)")
        w(f"#   l40s-dev    {float(dev_busy):.2f} of 160 GPUs time-sliced to notebooks")
        w(f"#   running     {len(self.running)} workloads ({sections.get('committed', 0)} committed services, "
          f"{sections.get('serving', 0)} more on MIG, {sections.get('training', 0)} training, "
          f"{sections.get('development', 0)} notebooks)")
        w(f"#   pending     {len(self.pending)} workloads")
        w("apiVersion: tessera/v1alpha1")
        w("kind: ClusterState")
        w("metadata: {name: acme-dc}")
        w("spec:")
        w(f'  observedAt: "{ts(OBSERVED_AT)}"')
        w("  nodes:")
        for n in self.nodes:
            w(f"    - name: {n.name}")
            w(f"      pool: {n.pool.name}")
            w(f"      labels: {flow(n.labels)}")
            w(f"      rack: {n.rack}")
            if n.nvlink_domain:
                w(f"      nvlinkDomain: {n.nvlink_domain}")
            w(f"      cpu: {n.pool.cpu_milli // 1000}")
            w(f"      memory: {n.pool.memory // 2**30}Gi")
            if n.health != "healthy":
                w(f"      health: {n.health}")
            w("      gpus:")
            for g in n.gpus:
                base = {"index": g.index, "uuid": uuid_of("GPU", f"{n.name}/{g.index}"), "model": n.pool.model}
                if g.health != "healthy":
                    base["health"] = g.health
                if n.pool.sharing != "mig":
                    w(f"        - {flow(base)}")
                    continue
                w(f"        - index: {g.index}")
                w(f"          uuid: {base['uuid']}")
                w(f"          model: {base['model']}")
                if g.health != "healthy":
                    w(f"          health: {g.health}")
                mig = {"enabled": g.mig_enabled}
                if g.mig_pending is not None:
                    mig["pending"] = g.mig_pending
                w(f"          mig: {flow(mig)}")
                if g.instances:
                    w("          instances:")
                    for pid, s in g.instances:
                        inst = {"profile": ID_TO_NAME[pid], "start": s,
                                "uuid": uuid_of("MIG", f"{n.name}/{g.index}/{pid}@{s}")}
                        w(f"            - {flow(inst)}")
        w("")
        w("  running:")
        titles = {
            "committed": "The committed services of workloads/*.yaml, as Git describes them.",
            "serving": "Deployments from the serving platform, and debugging sessions on MIG slices.",
            "training": "Training: whole GPUs; a gang's replicas are bound all together.",
            "development": "Notebooks, time-sliced on L40S: one trust domain per GPU, at most 4 clients.",
        }
        for section in ("committed", "serving", "training", "development"):
            w(f"    # {titles[section]}")
            for x in sorted((r for r in self.running if r.section == section), key=lambda r: r.name):
                w(f"    - name: {x.name}")
                emit_spec(w, x.spec, "      ")
                w("      bindings:")
                for b in x.bindings:
                    w(f"        - {flow(b)}")
                w(f'      startedAt: "{ts(x.started_at)}"')
                if x.checkpoint_at:
                    w(f'      lastCheckpointAt: "{ts(x.checkpoint_at)}"')
        w("")
        w("  # Waiting, in submission order.")
        w("  pending:")
        for x in self.pending:
            w(f"    - name: {x.name}")
            emit_spec(w, x.spec, "      ")
            w(f'      submittedAt: "{ts(x.submitted_at)}"')
        return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# YAML output.

_PLAIN = re.compile(r"[A-Za-z0-9_./@=][A-Za-z0-9_./@=+-]*")
_AMBIGUOUS = re.compile(r"-?[0-9]+(\.[0-9]*)?|true|false|null|~|yes|no|on|off", re.IGNORECASE)


def scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    s = str(v)
    if _PLAIN.fullmatch(s) and not _AMBIGUOUS.fullmatch(s):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def flow(v) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {flow(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(flow(x) for x in v) + "]"
    return scalar(v)


def emit_spec(w, spec: dict, indent: str):
    w(f"{indent}spec:")
    for k, v in spec.items():
        w(f"{indent}  {k}: {flow(v)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed file is stale")
    ap.add_argument("--output", type=Path, default=OUTPUT)
    args = ap.parse_args()
    policy = Policy(POLICY)
    gen = Generator(policy)
    gen.run()
    text = gen.render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run python3 tools/gen-acme.py", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output.relative_to(REPO)}: {len(text) / 1e6:.2f} MB, "
          f"{len(gen.nodes)} nodes, {len(gen.running)} running, {len(gen.pending)} pending")
    return 0


if __name__ == "__main__":
    sys.exit(main())
