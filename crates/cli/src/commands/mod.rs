//! One module per subcommand.

pub mod audit;
pub mod policy;
pub mod run;
pub mod serve;
pub mod tools;
pub mod trust;
