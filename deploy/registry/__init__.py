"""The registry's HTTP API (distribution v2 / OCI distribution spec), written once, for the push
(toolchain/publish/push.py) and the pre-flight before a job that pulls (deploy/plan.py):

    address   loopback or not, TLS or plain HTTP, up or not
    auth      the Docker CLI's login for a host; a WWW-Authenticate challenge parsed (RFC 7235)
    client    RegistryClient: one repository, TLS as the engine, the credential rule, bounded answers
    errors    failures typed by HTTP status and the registry's error codes
    check     the pre-flight question: does the registry serve this digest to these credentials

The local registry's process (start, stop) is the toolchain's (toolchain/publish/local_registry.py).
"""
