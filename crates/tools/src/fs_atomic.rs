//! Writing a file so that readers see either the old content or the new, never half of it.

use std::io::Write;
use std::path::Path;

use codemode_spec::ToolError;

use crate::support::io_error;

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, which is
/// atomic on one file system. Missing parent directories are created. An existing file keeps its
/// permissions.
pub(crate) fn atomic_write(path: &Path, bytes: &[u8]) -> Result<(), ToolError> {
    let parent = path.parent().ok_or_else(|| {
        ToolError::invalid(format!(
            "{} has no parent directory; give a file path, not the root",
            path.display()
        ))
    })?;
    std::fs::create_dir_all(parent).map_err(|e| io_error("create the directory", parent, &e))?;
    if path.is_dir() {
        return Err(ToolError::invalid(format!(
            "{} is a directory; give the path of a file inside it",
            path.display()
        )));
    }
    let existing_permissions = std::fs::metadata(path).ok().map(|m| m.permissions());
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut temp = tempfile::Builder::new()
        .prefix(&format!(".{file_name}."))
        .suffix(".tmp")
        .tempfile_in(parent)
        .map_err(|e| io_error("create a temporary file in", parent, &e))?;
    temp.write_all(bytes)
        .map_err(|e| io_error("write a temporary file in", parent, &e))?;
    if let Some(perms) = existing_permissions {
        temp.as_file()
            .set_permissions(perms)
            .map_err(|e| io_error("copy permissions onto the new content of", path, &e))?;
    }
    // Flush to disk before the rename so a crash cannot leave the new name on empty content.
    temp.as_file()
        .sync_all()
        .map_err(|e| io_error("flush the new content of", path, &e))?;
    temp.persist(path)
        .map_err(|e| io_error("move the new content into place at", path, &e.error))?;
    Ok(())
}
