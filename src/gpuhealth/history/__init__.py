"""Run history: every suite run's verdicts, findings and measured values, kept in a store
(SQLite by default, PostgreSQL for teams whose nightly runs come from several controllers), so
the next run can compare each node and GPU with its own past (families/history).

Controller side only: the nodes never see the store.
"""
