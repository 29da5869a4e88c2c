"""Checks that template.yaml (SAM, at its parameter defaults) and the CDK app's synthesized template
deploy the same coordinator: table and index, queues, function settings and LEASELOCK_* variables,
IAM statements, routes and their auth, the command queue's event source mapping, schedule, alarms
and dashboard metrics. It also checks on each side that a queue feeding a function stays invisible
for at least 6x the function's timeout (AWS's advice for Lambda event sources).

Usage: .venv/bin/python infra/sam-parity.py template.yaml infra/cdk.out/Leaselock.template.json
"""

import json
import os
import re
import sys

from cfnlint.decode import cfn_yaml
from samtranslator.translator.transform import transform


class NoManagedPolicies:
    """The template names no managed policies, so the translator needs no AWS look-up."""

    def load(self):
        return {}


def sam_template(path):
    template = json.loads(json.dumps(cfn_yaml.load(path)))
    # The translator accepts only S3 code locations; the code plays no part here.
    template["Globals"]["Function"]["CodeUri"] = "s3://bucket/key"
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")  # the translator asks boto for a region
    return transform(template, {}, NoManagedPolicies())


class Deployment:
    """One template in comparable terms: parameters at their defaults, resources by their type."""

    def __init__(self, template):
        self.resources = template["Resources"]
        self.defaults = {name: p.get("Default") for name, p in template.get("Parameters", {}).items()}
        self.conditions = template.get("Conditions", {})

    def condition(self, name):
        """A condition of the form Equals [Ref parameter, text] at the defaults; None for others."""
        spec = self.conditions.get(name, {})
        if list(spec) == ["Fn::Equals"]:
            left, right = spec["Fn::Equals"]
            if isinstance(left, dict) and list(left) == ["Ref"] and left["Ref"] in self.defaults:
                return str(self.defaults[left["Ref"]]) == str(right)
        return None

    def ref(self, name, attribute=None):
        if name in self.defaults:
            return str(self.defaults[name])
        if name in self.resources:
            kind = self.resources[name]["Type"]
            return f"<{kind}.{attribute}>" if attribute else f"<{kind}>"
        return "${" + name + "}"  # a pseudo parameter such as AWS::Region

    def norm(self, value):
        """Intrinsics resolved to text, scalars to strings."""
        if isinstance(value, list):
            return [self.norm(v) for v in value]
        if not isinstance(value, dict):
            return value if isinstance(value, str) else json.dumps(value)
        if list(value) == ["Ref"]:
            return self.ref(value["Ref"])
        if list(value) == ["Fn::GetAtt"]:
            target = value["Fn::GetAtt"]
            return self.ref(*(target if isinstance(target, list) else target.split(".", 1)))
        if list(value) == ["Fn::Join"]:
            separator, parts = value["Fn::Join"]
            return separator.join(self.norm(part) for part in parts)
        if list(value) == ["Fn::Sub"]:
            text = value["Fn::Sub"] if isinstance(value["Fn::Sub"], str) else value["Fn::Sub"][0]
            return re.sub(r"\$\{([^}.]+)(?:\.([^}]+))?\}", lambda m: self.ref(m.group(1), m.group(2)), text)
        if list(value) == ["Fn::If"]:
            name, then, otherwise = value["Fn::If"]
            chosen = self.condition(name)
            if chosen is not None:
                return self.norm(then if chosen else otherwise)
        normed = {key: self.norm(v) for key, v in value.items()}
        # A property set to AWS::NoValue (by an evaluated Fn::If) is absent.
        return {key: v for key, v in normed.items() if v != "${AWS::NoValue}" or key == "Ref"}

    def of_type(self, kind):
        return {name: r.get("Properties", {}) for name, r in self.resources.items() if r["Type"] == kind}

    def one(self, kind, word=""):
        [props] = [p for name, p in self.of_type(kind).items() if word in name]
        return props

    def table(self):
        props = self.norm(self.one("AWS::DynamoDB::Table"))
        props["AttributeDefinitions"].sort(key=lambda a: a["AttributeName"])
        keys = ["BillingMode", "KeySchema", "AttributeDefinitions", "GlobalSecondaryIndexes", "TimeToLiveSpecification",
                "PointInTimeRecoverySpecification", "SSESpecification", "DeletionProtectionEnabled"]
        return {key: props.get(key) for key in keys}

    QUEUE_KEYS = ["SqsManagedSseEnabled", "RedrivePolicy", "MessageRetentionPeriod", "VisibilityTimeout"]

    def queue(self, name):
        props = self.norm(self.resources[name]["Properties"])
        return {key: props.get(key) for key in self.QUEUE_KEYS}

    def queues(self):
        return sorted((self.queue(name) for name in self.of_type("AWS::SQS::Queue")), key=json.dumps)

    def event_sources(self):
        """Each event source mapping, with the function it invokes by role (router or reconciler)
        and the queue it polls by its settings."""
        mappings = []
        for props in self.of_type("AWS::Lambda::EventSourceMapping").values():
            mapping = self.norm({key: v for key, v in props.items() if key not in ("EventSourceArn", "FunctionName")})
            mapping["Function"] = self.function_role(props["FunctionName"]["Ref"])
            mapping["Queue"] = self.queue(props["EventSourceArn"]["Fn::GetAtt"][0])
            mappings.append(mapping)
        return sorted(mappings, key=json.dumps)

    def event_source_timeouts(self):
        """Problems with the visibility timeout of queues feeding functions: at least 6x the timeout."""
        problems = []
        for props in self.of_type("AWS::Lambda::EventSourceMapping").values():
            function = self.resources[props["FunctionName"]["Ref"]]["Properties"]
            queue = self.resources[props["EventSourceArn"]["Fn::GetAtt"][0]]["Properties"]
            timeout, visibility = int(function.get("Timeout", 3)), int(queue.get("VisibilityTimeout", 30))
            window = int(props.get("MaximumBatchingWindowInSeconds", 0))
            if visibility < 6 * timeout + window:
                problems.append(f"{self.function_role(props['FunctionName']['Ref'])}: visibility {visibility} s "
                                f"< 6 x timeout {timeout} s + batching window {window} s")
        return problems

    @staticmethod
    def function_role(name):
        [role] = [word for word in ("Router", "Reconciler") if word in name]
        return role

    def function(self, word):
        props = self.one("AWS::Lambda::Function", word)
        keys = ["Runtime", "Architectures", "Handler", "MemorySize", "Timeout", "LoggingConfig", "Environment"]
        settings = {key: self.norm(props.get(key)) for key in keys}
        settings["LoggingConfig"].pop("LogGroup", None)  # each names its own group
        return settings

    def permissions(self, word):
        """(action, resource) pairs the function's role is allowed, and its managed policies."""
        role = self.one("AWS::Lambda::Function", word)["Role"]["Fn::GetAtt"][0]
        role_props = self.resources[role]["Properties"]
        documents = [p["PolicyDocument"] for p in role_props.get("Policies", [])]
        documents += [p["PolicyDocument"] for p in self.of_type("AWS::IAM::Policy").values() if {"Ref": role} in p["Roles"]]
        pairs = set()
        for statement in self.norm([s for d in documents for s in d["Statement"]]):
            assert statement["Effect"] == "Allow", statement
            for action in statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]:
                for resource in statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]:
                    pairs.add((action, resource))
        return sorted(pairs), role_props.get("ManagedPolicyArns", [])

    def routes(self):
        routes = {f"{p['RouteKey']} {p.get('AuthorizationType', 'NONE')}" for p in self.of_type("AWS::ApiGatewayV2::Route").values()}
        for api in self.of_type("AWS::ApiGatewayV2::Api").values():  # SAM writes routes as an OpenAPI body
            for path, methods in api.get("Body", {}).get("paths", {}).items():
                for method, operation in methods.items():
                    auth = "AWS_IAM" if {"AWS_IAM": []} in operation.get("security", []) else "NONE"
                    routes.add(f"{method.upper()} {path} {auth}")
        return sorted(routes)

    def schedule(self):
        rule = self.norm(self.one("AWS::Events::Rule"))
        return rule["ScheduleExpression"], [t.get("RetryPolicy") for t in rule["Targets"]]

    def alarms(self):
        keys = ["AlarmDescription", "Namespace", "MetricName", "Dimensions", "Statistic", "Period", "EvaluationPeriods",
                "Threshold", "ComparisonOperator", "TreatMissingData", "Metrics"]
        alarms = [{key: p.get(key) for key in keys} for p in self.norm(list(self.of_type("AWS::CloudWatch::Alarm").values()))]
        return sorted(alarms, key=json.dumps)

    def dashboard_metrics(self):
        body = json.loads(self.norm(self.one("AWS::CloudWatch::Dashboard")["DashboardBody"]))
        metrics = set()
        for widget in body["widgets"]:
            for metric in widget["properties"]["metrics"]:
                options = metric[-1] if isinstance(metric[-1], dict) else {}
                stat = options.get("stat", widget["properties"].get("stat", "Average"))
                metrics.add(" ".join(m for m in metric if isinstance(m, str)) + f" {stat}")
        return sorted(metrics)


def main(sam_path, cdk_path):
    sam = Deployment(sam_template(sam_path))
    with open(cdk_path) as f:
        cdk = Deployment(json.load(f))
    checks = {
        "lease table and orphan index": lambda d: d.table(),
        "queues and their dead-letter queues": lambda d: d.queues(),
        "event sources (command queue -> router)": lambda d: d.event_sources(),
        "router settings and LEASELOCK_* variables": lambda d: d.function("Router"),
        "reconciler settings and LEASELOCK_* variables": lambda d: d.function("Reconciler"),
        "router permissions": lambda d: d.permissions("Router"),
        "reconciler permissions": lambda d: d.permissions("Reconciler"),
        "routes and their auth": lambda d: d.routes(),
        "reconcile schedule": lambda d: d.schedule(),
        "alarms": lambda d: d.alarms(),
        "dashboard metrics": lambda d: d.dashboard_metrics(),
    }
    failed = 0
    for name, check in checks.items():
        expected, actual = check(sam), check(cdk)
        if expected == actual:
            print(f"ok - {name}")
        else:
            failed += 1
            print(f"not ok - {name}\n  SAM: {json.dumps(expected)}\n  CDK: {json.dumps(actual)}")
    for side, deployment in (("SAM", sam), ("CDK", cdk)):
        problems = deployment.event_source_timeouts()
        if problems:
            failed += 1
            print(f"not ok - {side}: queue visibility timeouts of event sources\n  " + "\n  ".join(problems))
        else:
            print(f"ok - {side}: queue visibility timeouts of event sources")
    print(f"parity: {len(checks) + 2 - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
