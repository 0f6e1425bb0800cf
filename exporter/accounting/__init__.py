"""The routes' accounting, apart from the proxy that feeds it and the collectors that read it:
`ledger` keeps the counts as requests end and ticks pass; `snapshot` is what a reader gets, one
consistent, immutable reading at a time."""
