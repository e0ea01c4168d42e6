//! A prost codec that refuses requests carrying fields this API does not know.
//!
//! prost silently drops unknown fields, so a client built against another
//! version of the API (or with a typo'd field in a JSON-to-gRPC bridge) would
//! have part of its request ignored without a word. The decoder re-measures
//! what it decoded: every byte of a canonical proto3 encoding is accounted
//! for by a known field, so a shortfall means unknown fields (or a
//! non-canonical encoding, which proto3 encoders do not produce), and the
//! request is refused with `INVALID_ARGUMENT`.

use prost::Message;
use std::marker::PhantomData;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

/// Drop-in for `tonic_prost::ProstCodec` with strict decoding.
#[derive(Debug, Clone)]
pub struct StrictCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for StrictCodec<T, U> {
    fn default() -> Self {
        StrictCodec { _pd: PhantomData }
    }
}

impl<T, U> Codec for StrictCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder { _pd: PhantomData }
    }
}

#[derive(Debug, Clone)]
pub struct StrictDecoder<U> {
    _pd: PhantomData<U>,
}

impl<U: Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        use prost::bytes::Buf;
        let received = buf.remaining();
        let message = U::decode(&mut *buf)
            .map_err(|e| Status::invalid_argument(format!("malformed message: {e}")))?;
        let known = message.encoded_len();
        if known != received {
            return Err(Status::invalid_argument(format!(
                "message has {} bytes of fields this API does not know (unknown field numbers); \
                 check the client against arbiter.v1",
                received.saturating_sub(known)
            )));
        }
        Ok(Some(message))
    }
}
