"""The worker half of the runtime, what training code is written against: a virtual cluster over
placement groups (virtual_cluster), worker groups and their hosts (worker_group, worker_host,
host_pool, rank_env), call data (transfer, batched over batching/), failures (failures)."""
