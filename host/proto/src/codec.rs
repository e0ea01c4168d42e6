//! A prost codec that refuses requests carrying fields this API does not know.
//!
//! prost silently drops unknown fields, so a client built against another
//! version of the API (or with a typo'd field in a JSON-to-gRPC bridge) would
//! have part of its request ignored without a word. Before decoding, the
//! decoder walks the wire format against the API's own descriptor set
//! ([`crate::FILE_DESCRIPTOR_SET`]): every field number, in the message and
//! in every message nested in it, must be one the schema declares, or the
//! request is refused with `INVALID_ARGUMENT` naming the message and the
//! field number. Any valid encoding of known fields is accepted — packed or
//! unpacked repeated fields, explicitly encoded defaults, non-minimal
//! varints, negative integers — as the protobuf specification requires of a
//! parser.

use prost::Message;
use prost::bytes::Buf;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::OnceLock;
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
    U: Message + prost::Name + Default + Send + 'static,
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

impl<U: Message + prost::Name + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        let bytes = buf.copy_to_bytes(buf.remaining());
        check_known(&bytes, &U::full_name()).map_err(|e| {
            Status::invalid_argument(format!(
                "{e}: a field this API does not know; check the client against arbiter.v1"
            ))
        })?;
        let message = U::decode(bytes)
            .map_err(|e| Status::invalid_argument(format!("malformed message: {e}")))?;
        Ok(Some(message))
    }
}

/// A message's field numbers, and for each message-typed one the type.
#[derive(Debug, Default)]
struct Fields {
    known: HashMap<u32, Option<String>>,
}

/// Every message of the API (and the well-known types it uses) by full name.
fn schema() -> &'static HashMap<String, Fields> {
    static SCHEMA: OnceLock<HashMap<String, Fields>> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let mut out = HashMap::new();
        // The set is built into this crate by its build script: it always decodes.
        if let Ok(set) = prost_types::FileDescriptorSet::decode(crate::FILE_DESCRIPTOR_SET) {
            for file in &set.file {
                let package = file.package.clone().unwrap_or_default();
                for message in &file.message_type {
                    add(&mut out, &package, message);
                }
            }
        }
        out
    })
}

fn add(out: &mut HashMap<String, Fields>, scope: &str, message: &prost_types::DescriptorProto) {
    let name = format!("{scope}.{}", message.name.clone().unwrap_or_default());
    let mut fields = Fields::default();
    for f in &message.field {
        let nested = (f.r#type == Some(prost_types::field_descriptor_proto::Type::Message as i32))
            .then(|| f.type_name.clone().unwrap_or_default())
            .map(|t| t.trim_start_matches('.').to_string());
        fields.known.insert(f.number.unwrap_or(0) as u32, nested);
    }
    for nested in &message.nested_type {
        add(out, &name, nested);
    }
    out.insert(name, fields);
}

/// Walks `bytes` as an encoding of `message`: every field must be declared.
fn check_known(bytes: &[u8], message: &str) -> Result<(), String> {
    let Some(fields) = schema().get(message) else {
        // Not a message of this API (cannot happen for generated types): nothing to check.
        return Ok(());
    };
    let mut buf = bytes;
    while buf.has_remaining() {
        let key = prost::encoding::decode_varint(&mut buf).map_err(|e| e.to_string())?;
        let number = (key >> 3) as u32;
        let Some(nested) = fields.known.get(&number) else {
            return Err(format!("`{message}` has no field {number}"));
        };
        match key & 7 {
            0 => {
                prost::encoding::decode_varint(&mut buf).map_err(|e| e.to_string())?;
            }
            1 => skip(&mut buf, 8)?,
            5 => skip(&mut buf, 4)?,
            2 => {
                let len = prost::encoding::decode_varint(&mut buf).map_err(|e| e.to_string())?;
                let len = usize::try_from(len).map_err(|_| "length overflows".to_string())?;
                if buf.remaining() < len {
                    return Err("a length runs past the message".into());
                }
                if let Some(t) = nested {
                    check_known(&buf[..len], t)?;
                }
                buf.advance(len);
            }
            w => {
                return Err(format!(
                    "`{message}` field {number}: wire type {w} (groups) is not proto3"
                ));
            }
        }
    }
    Ok(())
}

fn skip(buf: &mut &[u8], n: usize) -> Result<(), String> {
    if buf.remaining() < n {
        return Err("a fixed-width field runs past the message".into());
    }
    buf.advance(n);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1;
    use prost::encoding::{WireType, encode_key, encode_varint};

    fn decode<U: Message + prost::Name + Default>(bytes: Vec<u8>) -> Result<U, Status> {
        check_known(&bytes, &U::full_name())
            .map_err(Status::invalid_argument)
            .and_then(|()| {
                U::decode(bytes.as_slice()).map_err(|e| Status::invalid_argument(e.to_string()))
            })
    }

    #[test]
    fn valid_encodings_of_known_fields_are_accepted() {
        // `states` (field 1) unpacked: one key per element, as older encoders write it.
        let mut b = Vec::new();
        for state in [1u64, 3] {
            encode_key(1, WireType::Varint, &mut b);
            encode_varint(state, &mut b);
        }
        // `limit` (3) = 0 written explicitly, as a non-minimal 3-byte varint.
        encode_key(3, WireType::Varint, &mut b);
        b.extend_from_slice(&[0x80, 0x80, 0x00]);
        let req: v1::ListJobsRequest = decode(b).unwrap();
        assert_eq!(req.states, vec![1, 3]);
        assert_eq!(req.limit, 0);

        // A negative int32 (`priority`, 7 in JobSpec) is a 10-byte varint.
        let spec = v1::JobSpec {
            name: "x".into(),
            priority: -5,
            ..Default::default()
        };
        let back: v1::JobSpec = decode(spec.encode_to_vec()).unwrap();
        assert_eq!(back.priority, -5);
    }

    #[test]
    fn an_unknown_field_is_named_wherever_it_is() {
        let mut b = v1::JobSpec {
            name: "x".into(),
            ..Default::default()
        }
        .encode_to_vec();
        encode_key(99, WireType::LengthDelimited, &mut b);
        encode_varint(4, &mut b);
        b.extend_from_slice(b"blue");
        let e = decode::<v1::JobSpec>(b.clone()).unwrap_err();
        assert!(
            e.message().contains("arbiter.v1.JobSpec") && e.message().contains("99"),
            "{e}"
        );
        // Nested: the same spec inside a submit request.
        let mut outer = Vec::new();
        encode_key(1, WireType::LengthDelimited, &mut outer);
        encode_varint(b.len() as u64, &mut outer);
        outer.extend_from_slice(&b);
        let e = decode::<v1::SubmitJobRequest>(outer).unwrap_err();
        assert!(
            e.message().contains("arbiter.v1.JobSpec has no field 99")
                || e.message().contains("`arbiter.v1.JobSpec` has no field 99"),
            "{e}"
        );
    }
}
