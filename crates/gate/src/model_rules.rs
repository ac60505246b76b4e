//! Which model operations may run at all, whatever the policy says.

/// Checked before the policy for every model call: `enabled: Some(false)` refuses them all,
/// `allow` keeps only the listed `provider/id` models.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelRules {
    pub enabled: Option<bool>,
    pub allow: Option<Vec<String>>,
}
