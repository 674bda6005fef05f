"""The agents store: named agents and the blocks their histories hold (`store`), their
conversations and manifests, what clients asked to keep (`retention`), the persistence behind
each turn (`write_behind`), and the cache's statistics and misses."""
