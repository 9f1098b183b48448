"""Each host's own environment for its ranks: `server` (`train`'s side), `client` (a rank's), `trust`."""
