"""The page pool in memory: which pages are free, held or cached (`block_pool`), the chained
hashes that find a cached prefix and decide eviction (`prefix`), the pages each sequence holds
(`block_manager`), and one page's K/V as host arrays (`page`). Bookkeeping over integers."""
