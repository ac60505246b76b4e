//! One module per subcommand.

pub mod approvals;
pub mod audit;
pub mod doctor;
pub mod policy;
pub mod run;
pub mod serve;
pub mod tools;
pub mod trust;
