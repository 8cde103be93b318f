//! `vxds dev-certs --dir DIR`: a development CA, a server certificate and client certificates
//! for mutual TLS, written as PEM files (`ca.pem`, `server.pem`/`server.key`,
//! `<client>.pem`/`<client>.key`). What exists is kept: run it again to add a client, or with
//! `--renew-server` to rotate the server certificate under the same CA. For development and
//! tests; production certificates come from your PKI (cert-manager, SPIRE, ...).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

#[derive(Debug, Args)]
pub struct DevCertsArgs {
    /// Where the files go (created if missing).
    #[arg(long)]
    dir: PathBuf,
    /// Names the server certificate is valid for (DNS names or IP addresses).
    #[arg(
        long = "server-name",
        value_delimiter = ',',
        default_values_t = ["localhost".to_owned(), "127.0.0.1".to_owned(), "vxds".to_owned()]
    )]
    server_names: Vec<String>,
    /// A client certificate `NAME=IDENTITY`, written as `NAME.pem` and `NAME.key`; IDENTITY
    /// (e.g. `spiffe://vxds.local/ns/default/sa/envoy`) becomes its URI SAN, or its DNS SAN if
    /// it has no scheme. Repeatable.
    #[arg(long = "client", value_parser = parse_client)]
    clients: Vec<(String, String)>,
    /// Issue a new server certificate (and key) even if one exists: a rotation.
    #[arg(long)]
    renew_server: bool,
}

fn parse_client(text: &str) -> Result<(String, String), String> {
    let (name, identity) = text
        .split_once('=')
        .ok_or("expected NAME=IDENTITY, e.g. envoy=spiffe://vxds.local/ns/default/sa/envoy")?;
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
    if !plain || name == "ca" || name == "server" {
        return Err(format!(
            "client name {name:?}: letters, digits, `-` and `_` only, and not `ca` or `server`"
        ));
    }
    if identity.is_empty() {
        return Err(format!("client {name}: the identity is empty"));
    }
    Ok((name.to_owned(), identity.to_owned()))
}

pub fn run(args: DevCertsArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let ca = ca(&args.dir)?;
    let server = args.dir.join("server.pem");
    if args.renew_server || !server.exists() {
        let mut params = CertificateParams::new(args.server_names.clone())
            .context("--server-name: not a DNS name or IP address")?;
        params
            .distinguished_name
            .push(DnType::CommonName, "vxds server");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        issue(&args.dir, "server", params, &ca)?;
    }
    for (name, identity) in &args.clients {
        if args.dir.join(format!("{name}.pem")).exists() {
            eprintln!("{name}.pem exists; kept");
            continue;
        }
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![if identity.contains("://") {
            SanType::URI(identity.as_str().try_into()?)
        } else {
            SanType::DnsName(identity.as_str().try_into()?)
        }];
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        issue(&args.dir, name, params, &ca)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The CA in `dir`, made on first use.
fn ca(dir: &Path) -> anyhow::Result<Issuer<'static, KeyPair>> {
    let (cert, key) = (dir.join("ca.pem"), dir.join("ca.key"));
    if cert.exists() {
        let key = std::fs::read_to_string(&key)
            .with_context(|| format!("reading the CA's key {}", key.display()))?;
        let key = KeyPair::from_pem(&key).context("the CA's key is not a PEM private key")?;
        let pem = std::fs::read_to_string(&cert)?;
        return Issuer::from_ca_cert_pem(&pem, key)
            .with_context(|| format!("{}: not a CA certificate", cert.display()));
    }
    if key.exists() {
        bail!(
            "{} exists without {}: remove it to make a new CA",
            key.display(),
            cert.display()
        );
    }
    let key_pair = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "vxds development CA");
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = params.self_signed(&key_pair)?;
    write(&key, &key_pair.serialize_pem(), true)?;
    write(&cert, &ca.pem(), false)?;
    eprintln!("wrote {} (a new development CA)", cert.display());
    Ok(Issuer::new(params, key_pair))
}

fn issue(
    dir: &Path,
    name: &str,
    mut params: CertificateParams,
    ca: &Issuer<'_, KeyPair>,
) -> anyhow::Result<()> {
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, ca)?;
    // The key first: a reloading server that sees the new certificate finds its key ready.
    write(&dir.join(format!("{name}.key")), &key.serialize_pem(), true)?;
    write(&dir.join(format!("{name}.pem")), &cert.pem(), false)?;
    eprintln!("wrote {}", dir.join(format!("{name}.pem")).display());
    Ok(())
}

/// Writes through a temporary file and a rename, so that a reader never sees half a file.
fn write(path: &Path, text: &str, secret: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let partial = path.with_extension("partial");
    let _ = std::fs::remove_file(&partial);
    let mut options = std::fs::File::options();
    options.write(true).create_new(true);
    // A key is never readable by others, not even for a moment.
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    options
        .open(&partial)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("writing {}", path.display()))
}
