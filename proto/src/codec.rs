//! tonic's protobuf codec, with one change: a message that does not decode
//! is the caller's fault, so it answers 3 INVALID_ARGUMENT naming the decode
//! error (tonic's own codec answers INTERNAL).

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstEncoder};

pub struct ProtobufCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for ProtobufCodec<T, U> {
    fn default() -> Self {
        ProtobufCodec(PhantomData)
    }
}

impl<T, U> Codec for ProtobufCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProtobufDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProtobufDecoder(PhantomData)
    }
}

pub struct ProtobufDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for ProtobufDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|e| Status::invalid_argument(format!("the message does not decode: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
