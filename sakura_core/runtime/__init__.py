"""Phone-side runtime: the sampler, the edit loop, the pipelined executor (fetch / decode / compute lanes), the
discrete-event simulator that replays it at phone scale, device profiles, the live profile and the timeline plot."""

from .denoise import EditResult, KVSource, run_edit
from .schedule import euler_sample, flow_timesteps

__all__ = ["EditResult", "KVSource", "euler_sample", "flow_timesteps", "run_edit"]
