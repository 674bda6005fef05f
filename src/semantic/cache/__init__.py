"""The KV cache, in three rooms: `pages/` (the pool in memory, prefix reuse, eviction order),
`disk/` (the tier below it and its files), `agents/` (named agents, their conversations and
manifests, and the cache's statistics). Agents use pages and disk; disk uses pages."""
