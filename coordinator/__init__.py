"""HACO coordinator: allocation policy, profiles, planning and the `haco` CLI."""
