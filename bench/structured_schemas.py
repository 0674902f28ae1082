"""What the structured scenario constrains outputs to: the long-output schema the decode figures
use, and twenty schemas of the kinds applications send, for the grammar compile times.

The twenty are written the way pydantic's ``model_json_schema()`` writes them (``title`` on
every model and field, nested models under ``$defs`` and reached by ``$ref``, ``Optional[X] =
None`` as ``anyOf`` with ``null`` and ``default: null``, enums as their own ``$defs`` entry,
``date``/``date-time``/``uuid`` formats, anchored ``pattern``s), some with ``extra="forbid"``
(``additionalProperties: false``) as OpenAI's strict mode asks. None uses a keyword
``backends.structured.check_schema`` refuses (``minimum``, a pydantic discriminator, ...): a
request with one gets a 400, so it never reaches a grammar.

``LONG_SCHEMA`` is an object holding an array of people with four string fields and at least
``LONG_MIN_ITEMS`` of them: the shortest valid answer is longer than any ``max_tokens`` the
scenario uses, so every constrained request runs to ``max_tokens``, as the unconstrained ones
do with their end tokens banned.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LONG_MIN_ITEMS", "LONG_SCHEMA", "SCHEMAS", "TOOL_SCHEMAS"]

Schema = dict[str, Any]

LONG_MIN_ITEMS = 16  # x ~13 tokens for the shortest person: past 128 tokens before it can end

_INT: Schema = {"type": "integer"}
_NUM: Schema = {"type": "number"}
_BOOL: Schema = {"type": "boolean"}
_UUID: Schema = {"type": "string", "format": "uuid"}
_DATE: Schema = {"type": "string", "format": "date"}
_DATETIME: Schema = {"type": "string", "format": "date-time"}
# "[.]", not "\\.": llama-cpp-python's converter copies the escape into the GBNF, where
# llama.cpp refuses it ("unknown escape"), so such a schema gets a 400 (BENCHMARKS.md).
_EMAIL: Schema = {
    "type": "string",
    "pattern": "^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+([.][A-Za-z0-9-]+)*[.][A-Za-z]{2,}$",
}
_PHONE: Schema = {"type": "string", "pattern": "^\\+[1-9][0-9]{6,14}$"}


def _str(**extra: Any) -> Schema:
    return {"type": "string", **extra}


def _ref(model: str) -> Schema:
    return {"$ref": f"#/$defs/{model}"}


def _opt(inner: Schema) -> Schema:
    """``Optional[X] = None`` as pydantic writes it."""
    return {"anyOf": [inner, {"type": "null"}], "default": None}


def _list(items: Schema, **extra: Any) -> Schema:
    return {"type": "array", "items": items, **extra}


def _enum(title: str, *values: str) -> Schema:
    return {"title": title, "type": "string", "enum": list(values)}


def _model(
    title: str,
    fields: Schema,
    *,
    optional: tuple[str, ...] = (),
    forbid: bool = False,
    defs: Schema | None = None,
) -> Schema:
    """A pydantic model: a title on every field but a bare ``$ref``, every field required but
    ``optional``, ``additionalProperties: false`` for ``extra="forbid"``."""
    properties = {
        key: value if "$ref" in value else {**value, "title": key.replace("_", " ").title()}
        for key, value in fields.items()
    }
    out: Schema = {"title": title, "type": "object", "properties": properties}
    out["required"] = [key for key in fields if key not in optional]
    if forbid:
        out["additionalProperties"] = False
    if defs:
        out["$defs"] = defs
    return out


_PERSON = _model(
    "Person", {"name": _str(), "city": _str(), "job": _str(), "note": _str()}, forbid=True
)
LONG_SCHEMA: Schema = _model(
    "PeopleList",
    {"people": _list(_ref("Person"), minItems=LONG_MIN_ITEMS, maxItems=64)},
    forbid=True,
    defs={"Person": _PERSON},
)

_NAME = _model("Name", {"given": _str(), "family": _str()})
_ADDRESS = _model(
    "Address",
    {
        "street": _str(),
        "city": _str(),
        "postal_code": _str(),
        "country": _str(pattern="^[A-Z]{2}$"),
    },
)
_LINE = _model(
    "LineItem",
    {
        "sku": _str(pattern="^[A-Z]{3}-[0-9]{4}$"),
        "description": _str(),
        "quantity": _INT,
        "unit_price": _NUM,
    },
    forbid=True,
)
_CARD = _model(
    "Card",
    {
        "kind": {"const": "card"},
        "last4": _str(pattern="^[0-9]{4}$"),
        "expiry": _str(pattern="^(0[1-9]|1[0-2])/[0-9]{2}$"),
    },
)
_TRANSFER = _model(
    "Transfer",
    {"kind": {"const": "transfer"}, "iban": _str(pattern="^[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}$")},
)
_CONTACT = _model("Contact", {"phone": _PHONE, "email": _opt(_EMAIL)}, optional=("email",))
_ENTITY = _model("Entity", {"text": _str(), "type": _ref("EntityType"), "start": _INT, "end": _INT})
_PRODUCT = _model(
    "Product",
    {
        "id": _UUID,
        "name": _str(),
        "price": _NUM,
        "in_stock": _BOOL,
        "category": _ref("ProductCategory"),
        "dimensions": _opt(_ref("Dimensions")),
    },
    optional=("dimensions",),
)
_JOB = _model(
    "Job",
    {"company": _str(), "role": _str(), "start": _DATE, "end": _opt(_DATE)},
    optional=("end",),
)
_SCHOOL = _model(
    "School", {"school": _str(), "degree": _opt(_str()), "year": _INT}, optional=("degree",)
)
_PASSENGER = _model(
    "Passenger",
    {"name": _ref("Name"), "born": _DATE, "passport": _str(pattern="^[A-Z0-9]{6,9}$")},
    forbid=True,
)
_SEGMENT = _model(
    "Segment",
    {
        "origin": _str(pattern="^[A-Z]{3}$"),
        "destination": _str(pattern="^[A-Z]{3}$"),
        "departs": _DATETIME,
    },
    forbid=True,
)
_TRANSACTION = _model(
    "Transaction",
    {"id": _UUID, "amount": _NUM, "category": _ref("Spend"), "merchant": _opt(_str())},
    optional=("merchant",),
)
_FLAG = _model(
    "Flag",
    {
        "key": _str(pattern="^[a-z][a-z0-9_]{2,31}$"),
        "enabled": _BOOL,
        "rollout": _NUM,
        "owners": _list(_EMAIL, maxItems=4),
    },
    forbid=True,
)
_PATIENT = _model(
    "Patient", {"id": _UUID, "name": _ref("Name"), "born": _DATE, "contact": _ref("Contact")}
)
_SLOT = _model(
    "Slot",
    {"day": _DATE, "time": _str(format="time"), "minutes": {"enum": [15, 30, 45, 60]}},
)

SCHEMAS: list[Schema] = [
    _model("Person", {"name": _str(), "age": _INT, "email": _EMAIL, "tags": _list(_str())}),
    _model(
        "Customer",
        {"id": _UUID, "name": _str(), "billing": _ref("Address"),
         "shipping": _opt(_ref("Address")), "phone": _opt(_PHONE)},
        optional=("shipping", "phone"),
        defs={"Address": _ADDRESS},
    ),
    _model(
        "Invoice",
        {"id": _UUID, "issued": _DATE, "due": _opt(_DATE), "currency": _ref("Currency"),
         "lines": _list(_ref("LineItem"), minItems=1),
         "payment": {"anyOf": [_ref("Card"), _ref("Transfer")]}},
        optional=("due",),
        forbid=True,
        defs={"Currency": _enum("Currency", "EUR", "USD", "GBP", "CHF", "JPY"),
              "LineItem": _LINE, "Card": _CARD, "Transfer": _TRANSFER},
    ),
    _model(
        "Triage",
        {"severity": _ref("Severity"), "category": _ref("Category"),
         "summary": _str(maxLength=200), "labels": _list(_str(), maxItems=5)},
        forbid=True,
        defs={"Severity": _enum("Severity", "low", "medium", "high", "critical"),
              "Category": _enum("Category", "billing", "bug", "account", "feature", "other")},
    ),
    _model(
        "Sentiment",
        {"label": _ref("Label"), "score": _NUM, "rationale": _str()},
        forbid=True,
        defs={"Label": _enum("Label", "positive", "neutral", "negative", "mixed")},
    ),
    _model(
        "Entities",
        {"entities": _list(_ref("Entity"))},
        defs={"Entity": _ENTITY,
              "EntityType": _enum("EntityType", "PERSON", "ORG", "LOC", "DATE", "MONEY")},
    ),
    _model(
        "Event",
        {"title": _str(), "start": _DATETIME, "end": _DATETIME,
         "attendees": _list(_ref("Attendee")), "location": _opt(_str()),
         "recurrence": _opt(_ref("Recurrence"))},
        optional=("location", "recurrence"),
        defs={"Attendee": _model("Attendee", {"name": _str(), "email": _EMAIL}),
              "Recurrence": _enum("Recurrence", "daily", "weekly", "monthly")},
    ),
    _model(
        "Catalog",
        {"products": _list(_ref("Product"), maxItems=20)},
        defs={"Product": _PRODUCT,
              "ProductCategory": _enum("ProductCategory", "tools", "garden", "kitchen", "books"),
              "Dimensions": _model("Dimensions", {"width_cm": _NUM, "height_cm": _NUM})},
    ),
    _model(
        "Labels",
        {"labels": _list({"enum": ["spam", "promo", "personal", "work"]}, minItems=1, maxItems=3),
         "confidence": _NUM},
        forbid=True,
    ),
    _model(
        "SqlAnswer",
        {"query": _str(), "tables": _list(_str()), "explanation": _opt(_str())},
        optional=("explanation",),
    ),
    _model(
        "Minutes",
        {"decisions": _list(_str()), "actions": _list(_ref("Action"))},
        defs={"Action": _model("Action", {"owner": _str(), "task": _str(), "due": _opt(_DATE)},
                               optional=("due",))},
    ),
    _model(
        "OrderStatus",
        {"order_id": _str(pattern="^ORD-[0-9]{8}$"), "status": _ref("Status"),
         "updated_at": _DATETIME},
        forbid=True,
        defs={"Status": _enum("Status", "placed", "paid", "shipped", "delivered", "returned")},
    ),
    _model(
        "Resume",
        {"name": _ref("Name"), "experience": _list(_ref("Job")),
         "education": _list(_ref("School")), "skills": _list(_str(), maxItems=10)},
        defs={"Name": _NAME, "Job": _JOB, "School": _SCHOOL},
    ),
    _model(
        "Recipe",
        {"title": _str(), "ingredients": _list(_ref("Ingredient")),
         "steps": _list(_str(), minItems=1), "minutes": _INT},
        defs={"Ingredient": _model("Ingredient", {"name": _str(), "quantity": _NUM,
                                                  "unit": _ref("Unit")}),
              "Unit": _enum("Unit", "g", "kg", "ml", "l", "tsp", "tbsp", "cup", "piece")},
    ),
    _model(
        "WeatherArgs",
        {"city": _str(), "country": _str(pattern="^[A-Z]{2}$"),
         "units": _str(enum=["metric", "imperial"]), "days": _INT},
        forbid=True,
    ),
    _model(
        "Booking",
        {"passengers": _list(_ref("Passenger"), minItems=1, maxItems=9),
         "segments": _list(_ref("Segment"), minItems=1, maxItems=4), "cabin": _ref("Cabin")},
        forbid=True,
        defs={"Passenger": _PASSENGER, "Segment": _SEGMENT, "Name": _NAME,
              "Cabin": _enum("Cabin", "economy", "premium", "business", "first")},
    ),
    _model(
        "SupportReply",
        {"answer": _str(), "citations": _list(_ref("Citation")), "needs_human": _BOOL},
        defs={"Citation": _model("Citation", {"doc_id": _UUID, "quote": _str()})},
    ),
    _model(
        "Transactions",
        {"items": _list(_ref("Transaction"))},
        defs={"Transaction": _TRANSACTION,
              "Spend": _enum("Spend", "groceries", "rent", "utilities", "transport", "dining",
                             "travel", "health", "insurance", "shopping", "salary", "other")},
    ),
    _model("Flags", {"flags": _list(_ref("Flag"))}, forbid=True, defs={"Flag": _FLAG}),
    _model(
        "Appointment",
        {"patient": _ref("Patient"), "provider": _ref("Name"), "slot": _ref("Slot"),
         "reason": _str(maxLength=500), "notes": _opt(_str())},
        optional=("notes",),
        defs={"Patient": _PATIENT, "Name": _NAME, "Contact": _CONTACT, "Slot": _SLOT},
    ),
]  # fmt: skip

# Function parameters for the tool-call grammars: eight of the schemas above, as a tool's
# arguments (objects, as OpenAI asks of a function's parameters).
TOOL_SCHEMAS: list[tuple[str, Schema]] = [
    ("get_weather", SCHEMAS[14]),
    ("order_status", SCHEMAS[11]),
    ("create_event", SCHEMAS[6]),
    ("book_flight", SCHEMAS[15]),
    ("file_ticket", SCHEMAS[3]),
    ("lookup_customer", SCHEMAS[1]),
    ("book_appointment", SCHEMAS[19]),
    ("categorise", SCHEMAS[17]),
]
