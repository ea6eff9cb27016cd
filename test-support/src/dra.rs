//! The kubelet's side of a DRA driver, in the real protobuf: its plugin watcher (dial the
//! registration socket in `plugins_registry/`, `GetInfo`, check the type and versions, connect
//! to the endpoint named, `NotifyRegistrationStatus`) and its DRA client (`NodePrepareResources`,
//! `NodeUnprepareResources`).

use std::path::{Path, PathBuf};

use cpupoold::kubernetes::dra::proto::{dra, pluginregistration as reg};
use cpupoold::kubernetes::grpc::clients::unix_channel;
use tonic::transport::Channel;

/// The plugin type the kubelet's DRA manager takes.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The service version this kubelet speaks.
pub const VERSION: &str = "v1.DRAPlugin";

/// A driver registered with the peer.
pub struct DraKubelet {
    /// What `GetInfo` answered.
    pub info: reg::PluginInfo,
    client: dra::dra_plugin_client::DraPluginClient<Channel>,
}

/// Registers the driver whose registration socket is `socket`, as the plugin watcher does
/// when it sees the socket; the reason it was refused, if it was (the driver is told too).
pub async fn register(socket: &Path) -> Result<DraKubelet, String> {
    let ch =
        unix_channel(socket.to_owned()).await.map_err(|e| format!("{}: {}", socket.display(), chain(&e)))?;
    let mut registration = reg::registration_client::RegistrationClient::new(ch);
    let info =
        registration.get_info(reg::InfoRequest {}).await.map_err(|e| format!("GetInfo: {e}"))?.into_inner();
    let client = if info.r#type != PLUGIN_TYPE {
        Err(format!("type `{}` is not {PLUGIN_TYPE}", info.r#type))
    } else if !info.supported_versions.iter().any(|v| v == VERSION) {
        Err(format!("none of the versions {:?} is {VERSION}", info.supported_versions))
    } else {
        unix_channel(PathBuf::from(&info.endpoint))
            .await
            .map(dra::dra_plugin_client::DraPluginClient::new)
            .map_err(|e| format!("connecting to the endpoint `{}`: {}", info.endpoint, chain(&e)))
    };
    let status = match &client {
        Ok(_) => reg::RegistrationStatus { plugin_registered: true, error: String::new() },
        Err(why) => reg::RegistrationStatus { plugin_registered: false, error: why.clone() },
    };
    registration
        .notify_registration_status(status)
        .await
        .map_err(|e| format!("NotifyRegistrationStatus: {e}"))?;
    Ok(DraKubelet { info, client: client? })
}

/// An error with its causes (`transport error: … : Connection refused (os error 111)`): tonic's
/// own text stops at "transport error".
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// A claim as the kubelet names it.
pub fn claim(namespace: &str, name: &str, uid: &str) -> dra::Claim {
    dra::Claim { namespace: namespace.into(), uid: uid.into(), name: name.into() }
}

impl DraKubelet {
    /// `NodePrepareResources` of `claims`.
    pub async fn prepare(
        &self,
        claims: Vec<dra::Claim>,
    ) -> Result<dra::NodePrepareResourcesResponse, tonic::Status> {
        let mut c = self.client.clone();
        Ok(c.node_prepare_resources(dra::NodePrepareResourcesRequest { claims }).await?.into_inner())
    }

    /// `NodeUnprepareResources` of `claims`.
    pub async fn unprepare(
        &self,
        claims: Vec<dra::Claim>,
    ) -> Result<dra::NodeUnprepareResourcesResponse, tonic::Status> {
        let mut c = self.client.clone();
        Ok(c.node_unprepare_resources(dra::NodeUnprepareResourcesRequest { claims }).await?.into_inner())
    }
}
