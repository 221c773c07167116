"""NeMo RL's `nemo_rl.distributed` API on this runtime: port by changing `nemo_rl.distributed.X`
imports to `runtime.nemo_rl.X`.

    nemo_rl.distributed.virtual_cluster                -> runtime.nemo_rl.virtual_cluster
        RayVirtualCluster: NeMo RL's constructor and lazy placement groups over
        runtime.workers.virtual_cluster.RayVirtualCluster (one placement group per node, stable node order)
    nemo_rl.distributed.worker_groups                  -> runtime.nemo_rl.worker_groups
        RayWorkerBuilder, RayWorkerGroup, MultiWorkerFuture: the user's own actors in the cluster's
        bundles, each with runtime.workers.rank_env's rank environment; sharded calls by NamedSharding
    nemo_rl.distributed.ray_actor_environment_registry -> runtime.nemo_rl.ray_actor_environment_registry
        one image, one interpreter: every actor runs on the image's Python
    nemo_rl.distributed.batched_data_dict              -> runtime.nemo_rl.batched_data_dict (runtime.workers.batched)
    nemo_rl.distributed.named_sharding                 -> runtime.nemo_rl.named_sharding (runtime.workers.named_sharding)
"""
