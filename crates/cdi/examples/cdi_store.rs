//! A command-line door into the crate, for the Go conformance tests (`tests/conformance/cdi`):
//! they drive our `SpecStore`, version computation and validation through it and check the results
//! against the upstream CDI implementation the runtimes use.
//!
//! ```text
//! cdi_store write <dir> <vendor> <uid>   stdin: JSON array of container edits
//!                                        stdout: JSON array of the qualified device names
//! cdi_store remove <dir> <vendor> <uid>  stdout: true if a spec was removed, else false
//! cdi_store claims <dir> <vendor>        stdout: JSON array of the claim UIDs on disk
//! cdi_store min-version                  stdin: a spec (YAML or JSON); stdout: its minimum version
//! cdi_store validate                     stdin: a spec; exit status 0 if valid, else 1
//! cdi_store claim-of <qualified-name>    stdout: {"vendor": .., "uid": .., "index": ..}
//! ```
//!
//! Errors go to stderr with their whole cause chain, and the exit status is 1.

use std::io::{self, Read};

use anyhow::{Context, bail};
use cdi::{ContainerEdits, Spec, SpecStore};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["write", dir, vendor, uid] => {
            let edits: Vec<ContainerEdits> =
                serde_json::from_slice(&stdin()?).context("parsing the edits on stdin")?;
            let names = SpecStore::new(dir, vendor)?.write_claim(uid, &edits)?;
            let names: Vec<String> = names.iter().map(ToString::to_string).collect();
            println!("{}", serde_json::to_string(&names)?);
        }
        ["remove", dir, vendor, uid] => {
            println!("{}", SpecStore::new(dir, vendor)?.remove_claim(uid)?);
        }
        ["claims", dir, vendor] => {
            let claims = SpecStore::new(dir, vendor)?.claims()?;
            let claims: Vec<&str> = claims.iter().map(|c| c.as_str()).collect();
            println!("{}", serde_json::to_string(&claims)?);
        }
        ["min-version"] => {
            let spec = Spec::from_yaml(&stdin()?)?;
            println!("{}", cdi::minimum_version(&spec));
        }
        ["validate"] => {
            let spec = Spec::from_yaml(&stdin()?)?;
            cdi::validate_spec(&spec)?;
        }
        ["claim-of", qualified] => {
            let device = cdi::claim_of_device(qualified)?;
            let json = serde_json::json!({
                "vendor": device.vendor,
                "uid": device.uid.as_str(),
                "index": device.index,
            });
            println!("{json}");
        }
        _ => bail!(
            "usage: cdi_store write|remove <dir> <vendor> <uid> | claims <dir> <vendor> | \
             min-version | validate | claim-of <qualified-name>"
        ),
    }
    Ok(())
}

fn stdin() -> anyhow::Result<Vec<u8>> {
    let mut data = Vec::new();
    io::stdin()
        .read_to_end(&mut data)
        .context("reading stdin")?;
    Ok(data)
}
