"""Entry points and orchestration: train (one run), table (regenerate a paper table),
describe (sizes without training), ledger (the results store)."""
