//! The schema, as numbered migrations shared by SQLite and PostgreSQL. Each runs once, in a
//! transaction that also records its number, so a crash mid-migration leaves nothing half done.

/// `(version, SQL)`, in order. Append new migrations; never edit an applied one.
pub(crate) const MIGRATIONS: &[(i64, &str)] = &[(1, include_str!("v1.sql"))];

/// The newest schema this build knows.
pub(crate) fn latest() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}
