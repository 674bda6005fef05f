"""The agents store, a module a concern: one agent (`agent`), which agents there are
(`registry`), a request's way through the cache (`ledger`), the tiers of their history pages
(`histories`), pins and breakpoints (`holds`, over `pins` and `retention`), their lifecycle
under the limits (`lifecycle`), their manifests (`records`, `manifest`), persist and evict
(`persist`, and `write_behind` behind each turn), their conversations, their descriptions
(`describe`), and the cache's statistics (`stats`, `misses`); `store` is the one object the
engine holds, passing each call to its owner."""
