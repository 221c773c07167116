"""The cluster half of the runtime: a node forms a Ray cluster from whatever the scheduler gives it
(identity, ports), waits for every node (launch, ray_agent), starts Python workers fast (zygote,
trampoline, preload) and, held, serves drivers sent to it (serving). It names the worker half once,
through contract.WARM_HOSTS (the warm hosts a node starts after the barrier)."""
