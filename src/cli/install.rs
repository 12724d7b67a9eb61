//! `leasehold install DIR`: copy this (static) binary to `DIR/leasehold`, so that an
//! image that has never heard of leasehold can run `leasehold run`: an initContainer
//! from the leasehold image installs it into an `emptyDir` the app container mounts
//! (see `examples/any-image.yaml`).
//!
//! The copy is written beside its final name and renamed into place, so a container
//! never sees half a binary, and a restarted initContainer replaces it whole.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Options of `leasehold install`.
#[derive(clap::Args, Debug)]
pub struct InstallArgs {
    /// The directory to put `leasehold` in (an `emptyDir` mount, say).
    pub dir: PathBuf,
}

/// Errors of `leasehold install`, each naming the action that failed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// This process's own executable could not be read.
    #[error("reading this binary ({0}): {1}")]
    ReadSelf(String, #[source] std::io::Error),
    /// The copy could not be written or moved into place.
    #[error("writing {0}: {1}")]
    Write(String, #[source] std::io::Error),
}

/// Copy the binary at `from` to `dir/leasehold`, executable by everyone (the app
/// container may run as any user); returns the path written.
pub fn install_from(from: &Path, dir: &Path) -> Result<PathBuf, InstallError> {
    let bytes = std::fs::read(from).map_err(|e| InstallError::ReadSelf(from.display().to_string(), e))?;
    let target = dir.join("leasehold");
    let partial = dir.join(".leasehold.partial");
    let write = |path: &Path| -> std::io::Result<()> {
        let mut f = std::fs::File::create(path)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
    };
    write(&partial)
        .and_then(|()| std::fs::rename(&partial, &target))
        .map_err(|e| InstallError::Write(target.display().to_string(), e))?;
    Ok(target)
}

/// `leasehold install DIR`: this binary to `DIR/leasehold`.
pub fn run(args: &InstallArgs) -> Result<(), InstallError> {
    let me = Path::new("/proc/self/exe");
    let target = install_from(me, &args.dir)?;
    println!(
        "installed {} (run it as `{} run --lock NAME -- CMD`)",
        target.display(),
        target.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory of this test's own (removed when dropped).
    struct TempDir(PathBuf);
    impl TempDir {
        fn new() -> Self {
            let p = std::env::temp_dir().join(format!("leasehold-install-{:x}", rand::random::<u64>()));
            std::fs::create_dir(&p).unwrap();
            TempDir(p)
        }
        fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn the_copy_is_whole_executable_by_all_and_replaces_an_older_one() {
        let dir = TempDir::new();
        let src = dir.path().join("src-binary");
        std::fs::write(&src, b"#!/bin/sh\necho new\n").unwrap();
        std::fs::write(dir.path().join("leasehold"), b"old").unwrap();
        let target = install_from(&src, dir.path()).unwrap();
        assert_eq!(target, dir.path().join("leasehold"));
        assert_eq!(std::fs::read(&target).unwrap(), b"#!/bin/sh\necho new\n");
        let mode = std::fs::metadata(&target).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        assert!(!dir.path().join(".leasehold.partial").exists());
    }

    #[test]
    fn a_missing_directory_is_named_in_the_error() {
        let dir = TempDir::new();
        let src = dir.path().join("src-binary");
        std::fs::write(&src, b"x").unwrap();
        let err = install_from(&src, &dir.path().join("absent")).unwrap_err();
        assert!(err.to_string().contains("absent/leasehold"), "{err}");
        let err = install_from(&dir.path().join("nothing"), dir.path()).unwrap_err();
        assert!(matches!(err, InstallError::ReadSelf(..)), "{err}");
    }
}
