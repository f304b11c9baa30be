"""Settings of the fleet simulator (``python -m infera.sim``)."""

from __future__ import annotations

import dataclasses

from infera.config.base import ConfigError, option

DEFAULT_SIM_POLICIES = ("round-robin", "least-load", "kv-aware", "approx-prefix")


@dataclasses.dataclass(frozen=True)
class SimSettings:
    trace: str = option("", "a Mooncake-format JSONL trace to replay (or --workload)")
    workload: str = option("", "comma-separated workloads of infera.sim.workloads, or 'all' (or --trace)")
    workers: int = option(16, "simulated engines in the fleet")
    policies: tuple[str, ...] = option(DEFAULT_SIM_POLICIES, "router policies to compare, one run each")
    kv_blocks: int = option(2048, "KV blocks per engine")
    block_size: int = option(16, "tokens per KV block")
    max_num_seqs: int = option(256, "max sequences in an engine's running batch")
    max_num_batched_tokens: int = option(8192, "token budget per engine step (chunked prefill)")
    speedup_ratio: float = option(1.0, "divide every modelled step time by this")
    scale: int = option(8, "trace: divide prompt and output lengths and the 512-token trace block by this")
    time_scale: float = option(1.0, "trace: multiply arrival times by this (0.5 = twice as fast)")
    limit: int = option(0, "trace: replay the first N requests only (0 = all)")
    quick: bool = option(False, "workloads: the smaller sizes")
    kv_overlap_weight: float = option(1.0, "the router's --kv-overlap-weight")
    temperature: float = option(0.0, "the router's pick temperature (0 = lowest cost, fair ties)")
    event_delay: float = option(0.005, "seconds from an engine publishing KV events to the router applying them")
    seed: int = option(0, "seeds the trace's token ids, the workloads and the router's tie-break")
    name: str = option("", "results file stem (default: sim-<input>-<workers>w)")
    out_dir: str = option("bench/results", "where the JSON results go")
    plot_dir: str = option("bench/plots", "where the plot goes")
    plot: bool = option(True, "draw the plot (matplotlib)")
    profile: bool = option(False, "cProfile the first policy's run and print the top of it")

    def __post_init__(self) -> None:
        if bool(self.trace) == bool(self.workload):
            raise ConfigError("give exactly one of --trace and --workload")
        if self.workers <= 0 or self.kv_blocks < 2 or self.block_size <= 0:
            raise ConfigError("--workers and --block-size must be > 0, --kv-blocks >= 2")
        if self.scale <= 0 or self.time_scale <= 0 or self.speedup_ratio <= 0:
            raise ConfigError("--scale, --time-scale and --speedup-ratio must be > 0")
        if self.event_delay < 0 or self.limit < 0:
            raise ConfigError("--event-delay and --limit must be >= 0")
