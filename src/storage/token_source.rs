//! How a keyless connection obtains its tokens, as plain data: read from app settings by
//! `app_settings`, carried by `settings::ConnectionSettings`, used by `token`. Secrets never print.

use std::fmt;

/// Which managed identity to ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ManagedIdentityId {
    /// The system-assigned identity.
    System,
    /// A user-assigned identity by client id.
    ClientId(String),
    /// A user-assigned identity by ARM resource id.
    ResourceId(String),
}

/// Where managed-identity tokens come from.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum ManagedIdentityEndpoint {
    /// App Service/Functions: `IDENTITY_ENDPOINT`, authenticated by `IDENTITY_HEADER` (a secret).
    AppService { endpoint: String, header: String },
    /// The instance metadata service (VMs, scale sets, Container Apps without App Service).
    Imds,
}

impl fmt::Debug for ManagedIdentityEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ManagedIdentityEndpoint::AppService { endpoint, .. } => {
                write!(f, "AppService({endpoint}, header redacted)")
            }
            ManagedIdentityEndpoint::Imds => f.write_str("Imds"),
        }
    }
}

/// How a keyless connection obtains its tokens, as plain data. Secrets never print.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum TokenSource {
    ManagedIdentity {
        endpoint: ManagedIdentityEndpoint,
        id: ManagedIdentityId,
    },
    ClientSecret {
        tenant_id: String,
        client_id: String,
        client_secret: String,
    },
    WorkloadIdentity {
        tenant_id: String,
        client_id: String,
        token_file: String,
    },
    AzureCli,
}

impl fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::ManagedIdentity { endpoint, id } => {
                write!(f, "managedidentity({endpoint:?}, {id:?})")
            }
            TokenSource::ClientSecret {
                tenant_id,
                client_id,
                ..
            } => write!(
                f,
                "clientsecret(tenant {tenant_id}, client {client_id}, secret redacted)"
            ),
            TokenSource::WorkloadIdentity {
                tenant_id,
                client_id,
                token_file,
            } => write!(
                f,
                "workloadidentity(tenant {tenant_id}, client {client_id}, file {token_file})"
            ),
            TokenSource::AzureCli => f.write_str("azurecli"),
        }
    }
}
