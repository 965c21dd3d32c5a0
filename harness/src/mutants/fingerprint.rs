//! What a kill map was learned from: each scenario file's content hash, so a map whose scenario changed since it
//! was recorded is not trusted for that scenario.

use std::path::Path;

use sha2::Digest as _;

/// The sha256 of a file's bytes, as lowercase hex.
pub fn sha256_of_file(path: &Path) -> std::io::Result<String> {
    let bytes = std::fs::read(path)?;
    Ok(sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect())
}
