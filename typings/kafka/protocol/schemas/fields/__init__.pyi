# Hand-written: what the broker uses of kafka-python's schema field classes.
from kafka.protocol.schemas.fields.base import BaseField as BaseField
