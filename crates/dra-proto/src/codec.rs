//! The gRPC codec of the generated services: prost, with undecodable messages reported as
//! `InvalidArgument`.
//!
//! tonic's stock prost codec maps a message that does not decode to `Internal`. For a server that
//! is the wrong signal: `Internal` says "something broke on our side", while a request whose bytes
//! are not a valid message is the caller's fault and retrying it cannot help. The kubelet-facing
//! servers promise `InvalidArgument` for malformed requests, so the generated code (see
//! `cargo xtask codegen`) uses this codec instead. Encoding is tonic-prost's, unchanged.
//!
//! The generated clients use the same codec; only tests use them, and for them a response that
//! does not decode is reported as `InvalidArgument` too.

use std::marker::PhantomData;

use tonic::{
    Status,
    codec::{BufferSettings, Codec, DecodeBuf, Decoder},
};
use tonic_prost::{ProstCodec, ProstEncoder};

/// A prost codec whose decode failures are `InvalidArgument`.
#[derive(Debug, Clone, Copy)]
pub struct InvalidArgumentCodec<T, U> {
    _messages: PhantomData<fn() -> (T, U)>,
}

impl<T, U> Default for InvalidArgumentCodec<T, U> {
    fn default() -> Self {
        Self {
            _messages: PhantomData,
        }
    }
}

impl<T, U> Codec for InvalidArgumentCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = InvalidArgumentDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        InvalidArgumentDecoder {
            _message: PhantomData,
        }
    }
}

/// Decodes `U` with prost; a decode failure is `InvalidArgument` naming the message type.
#[derive(Debug, Clone, Copy)]
pub struct InvalidArgumentDecoder<U> {
    _message: PhantomData<fn() -> U>,
}

impl<U> Decoder for InvalidArgumentDecoder<U>
where
    U: prost::Message + Default + Send + 'static,
{
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|e| {
            Status::invalid_argument(format!("malformed {} message: {e}", short_type_name::<U>()))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        // The same settings tonic-prost's own decoder uses.
        ProstCodec::<U, U>::raw_decoder(BufferSettings::default()).buffer_settings()
    }
}

/// `NodePrepareResourcesRequest` rather than the full module path.
fn short_type_name<U>() -> &'static str {
    let full = std::any::type_name::<U>();
    full.rsplit("::").next().unwrap_or(full)
}
