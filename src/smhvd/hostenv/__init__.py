"""Each host's own environment for its ranks: `train` serves it (`server`), each rank takes it (`client`),
and both trust only what `trust` allows."""
