"""Phone-side runtime: sampler, edit loop, (later) pipelined executor and timeline."""

from .edit import EditResult, KVSource, run_edit
from .sampler import euler_sample, flow_timesteps

__all__ = ["EditResult", "KVSource", "euler_sample", "flow_timesteps", "run_edit"]
