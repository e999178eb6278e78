"""Alias kept for one release: ``python -m zeropp_hier.train`` runs the Hydra app, which now
lives in ``zeropp_hier.app.train`` (see __main__.py). A package rather than a train.py module so
that git still sees the old train.py as renamed to app/train.py."""
