//! The schema, as numbered migrations. Each runs once, in a transaction that also records its
//! number, so a crash mid-migration leaves nothing half done. The tables are the same on
//! SQLite and PostgreSQL; PostgreSQL adds functions that charge budgets in one statement.

/// `(version, SQL)`, in order. Append new migrations; never edit an applied one.
pub(crate) const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("v1.sql")),
    (2, include_str!("v2.sql")),
    (3, include_str!("v3.sql")),
    (4, include_str!("v4.sql")),
    (5, include_str!("v5.sql")),
];

/// What PostgreSQL runs for each version, after the shared SQL.
const POSTGRES_EXTRA: &[(i64, &str)] = &[
    (1, include_str!("postgres_v1.sql")),
    (2, include_str!("postgres_v2.sql")),
    (3, include_str!("postgres_v3.sql")),
];

/// The newest schema this build knows.
pub(crate) fn latest() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}

/// The migrations as PostgreSQL runs them.
pub(crate) fn postgres() -> Vec<(i64, String)> {
    MIGRATIONS
        .iter()
        .map(|(v, sql)| {
            let extra = POSTGRES_EXTRA
                .iter()
                .filter(|(x, _)| x == v)
                .map(|(_, s)| *s)
                .collect::<Vec<_>>()
                .join("\n");
            (*v, format!("{sql}\n{extra}"))
        })
        .collect()
}
