"""The request models of every route (pydantic, as FastAPI expects): each field is parsed strictly, and every
violation becomes a 400 with a JSON message naming the field (`parse`), never a 500 and never a silent rounding.

- ids are ASCII digits (a path or a form field) or JSON integers, within int64 ("٣", "５", 10^30 and 2.7 are refused);
- counts and offsets are bounded integers;
- `embedding_input` is a list of finite JSON numbers (no strings, booleans or nested lists) of the index's
  dimension with a non-zero norm (checked against the index in `knn.py`);
- texts are strings without control characters or lone surrogates (`foco.utils.text`) within the server's length
  limit; a blank text is refused wherever a text is searched (`SearchEngine.check_text`, the one rule of every route);
- every number has a documented range: `chord` 0-100 (`MAX_CHORD`), `aesthetic_score` an integer 0-9 and
  `aesthetic_weight` 0-1 (clip-retrieval's ten aesthetic levels and its client's documented weight), so that no
  answer holds an infinity or a NaN;
- `indice_name` names one of the served indexes (`foco.search.named`).
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Optional, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr,
                      ValidationError, field_validator)

from ..search.engine import MAX_CHORD, QueryError
from ..utils.text import text_problem

INT64_MAX = 2 ** 63 - 1


def _ascii_int(value: Any) -> int:
    """An integer field: a JSON integer, an integral finite JSON number (40.0), or ASCII digits with an optional
    sign (a form or path value), within int64."""
    if isinstance(value, bool):
        raise ValueError("must be an integer, not a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2 ** 63:
        return int(value)  # JSON's 40.0; 2.7 is refused, never rounded
    if isinstance(value, str):
        from ..utils.parse import ascii_integer
        try:
            return ascii_integer(value)  # the CLI's rule too (`foco.utils.parse`): ASCII digits within int64
        except ValueError as exc:
            raise ValueError(f"must be an integer (int64) written in ASCII digits: {exc}") from None
    raise ValueError(f"must be an integer (int64) written in ASCII digits, got {value!r}")


def _finite(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    if isinstance(value, str):  # a form field: the one number rule (`foco.utils.parse`), as on the command line
        from ..utils.parse import ascii_real
        try:
            return ascii_real(value)
        except ValueError as exc:
            raise ValueError(f"must be a finite number in ASCII decimal: {exc}") from None
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"must be a number, got {value!r}") from None
    if not math.isfinite(x):
        raise ValueError(f"must be a finite number, got {value!r}")
    return x


def _text(value: Any) -> str:
    problem = text_problem(value, allow_empty=True)
    if problem:
        raise ValueError(problem)
    return value


FormInt = Annotated[int, BeforeValidator(_ascii_int)]
Id = Annotated[int, BeforeValidator(_ascii_int), Field(ge=0, le=INT64_MAX)]
Text = Annotated[str, BeforeValidator(_text)]
Number = Annotated[float, BeforeValidator(_finite)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class SearchForm(_Model):
    """POST /search, from its multipart form (every value a string)."""

    text: Text = ""
    reference_id: Optional[Id] = None
    k: Annotated[FormInt, Field(ge=1, le=INT64_MAX)] = 10
    method: Optional[Annotated[StrictStr, Field(max_length=64)]] = None
    box: Optional[StrictStr] = None
    chord: Annotated[Number, Field(ge=0, le=MAX_CHORD)] = 0.0
    indice_name: Optional[Annotated[StrictStr, Field(max_length=64)]] = None


class GalleryQuery(_Model):
    """GET /gallery?offset&limit."""

    offset: Annotated[FormInt, Field(ge=0, le=2 ** 62)] = 0
    limit: Annotated[FormInt, Field(ge=1, le=500)] = 60
    indice_name: Optional[Annotated[StrictStr, Field(max_length=64)]] = None


class MetadataRequest(_Model):
    """POST /metadata (clip-retrieval)."""

    ids: list[Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]]
    indice_name: Optional[StrictStr] = None


class KnnRequest(_Model):
    """POST /knn-service (clip-retrieval's ClipClient sends every field; unknown ones are ignored, as there)."""

    text: Optional[Text] = None
    image: Optional[StrictStr] = None
    image_url: Optional[StrictStr] = None
    embedding_input: Optional[list[Union[StrictInt, StrictFloat]]] = None
    modality: StrictStr = "image"
    num_images: Annotated[FormInt, Field(ge=1, le=INT64_MAX)] = 40
    num_result_ids: Optional[Annotated[FormInt, Field(ge=1, le=INT64_MAX)]] = None
    indice_name: Optional[StrictStr] = None
    deduplicate: StrictBool = False
    use_safety_model: StrictBool = False
    use_violence_detector: StrictBool = False
    use_mclip: StrictBool = False
    aesthetic_score: Optional[int] = None  # 0-9; clip-front sends "" (none) or the number as a string
    aesthetic_weight: Optional[float] = None  # 0-1; "" is none

    @field_validator("aesthetic_score", mode="before")
    @classmethod
    def _level(cls, v):
        if v is None or v == "":
            return None
        n = _ascii_int(v)  # a JSON integer, 9.0, or "9"; 2.5 and "nine" are refused
        if not 0 <= n <= 9:
            raise ValueError(f"must be an aesthetic level, an integer from 0 to 9, got {v!r}")
        return n

    @field_validator("aesthetic_weight", mode="before")
    @classmethod
    def _weight(cls, v):
        if v is None or v == "":
            return None
        x = _finite(v)
        if not 0 <= x <= 1:
            raise ValueError(f"must be a weight between 0 and 1, got {v!r}")
        return x

    @field_validator("embedding_input")
    @classmethod
    def _finite_values(cls, v):
        if v is None:
            return v
        try:
            if all(math.isfinite(x) for x in v):
                return v
        except OverflowError:  # an integer beyond any float
            pass
        raise ValueError("must hold finite numbers only")


def parse(model: type[_Model], data: Any) -> Any:
    """`data` validated into `model`; a violation is a QueryError naming each field and what is wrong (a 400)."""
    if not isinstance(data, dict):
        raise QueryError("the request must be a JSON object (or a form) of named fields")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        parts = []
        for e in exc.errors(include_url=False)[:5]:
            where = ".".join(str(p) for p in e["loc"]) or "body"
            parts.append(f"{where}: {e['msg'].removeprefix('Value error, ')}")
        raise QueryError("invalid request: " + "; ".join(parts)) from None
