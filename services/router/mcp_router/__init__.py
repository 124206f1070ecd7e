"""mcp_router: the data plane's entry. ``frontends`` adapt each protocol to the ``DataPlane``; ``router``
implements it over the etcd-fed ``snapshot``, choosing with ``routing`` and sending with ``delivery``."""
