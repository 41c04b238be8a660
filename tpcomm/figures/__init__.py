"""Figure machinery every command shares: PNGs that carry their data's digest, one style per way, labels that
never overprint, the measuring commands' figures."""
