"""The agents store: named agents (`agent`) and the blocks their histories hold (`store`), the
pages their pins hold (`pins`), their persistence (`persist`, `manifest`, `write_behind` behind
each turn), their conversations, what clients asked to keep (`retention`), and the cache's
statistics (`stats`, `misses`)."""
