"""Models shaped like published Keras examples, for the drop-in tests.

Each `make_*` returns `(model, x, y, fit_kwargs)`, where `model` is compiled
and built as the example would build it, and the data is unbatched (a
`tf.data.Dataset` of single elements, or arrays), so that `kerascale.fit`
runs its batch search and its trials. They live in a module of their own
(not a test file) so that probe child processes can import their classes.
The classes are deliberately written the way the examples write them: no
`**kwargs`, no `get_config`, unregistered, plain functions in `Lambda`s.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

N = 256


def _rng(seed=0):
    return np.random.default_rng(seed)


# --- 1. A GAN: train_step, a custom compile, no call() -------------------------


class GAN(keras.Model):
    """The DCGAN example's shape: two sub-models, their own optimizers."""

    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real):
        batch = tf.shape(real)[0]
        noise = tf.random.normal((batch, self.latent_dim))
        fake = self.generator(noise)
        # As the example does: real and generated images in one batch.
        images = tf.concat([fake, real], axis=0)
        labels = tf.concat([tf.ones((batch, 1)), tf.zeros((batch, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(images))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(
            zip(grads, self.discriminator.trainable_weights, strict=True)
        )
        noise = tf.random.normal((batch, self.latent_dim))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(
                tf.zeros((batch, 1)), self.discriminator(self.generator(noise))
            )
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(
            zip(grads, self.generator.trainable_weights, strict=True)
        )
        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {"d_loss": self.d_loss_metric.result(), "loss": g_loss}


def make_gan():
    latent = 8
    discriminator = keras.Sequential(
        [keras.Input((16,)), layers.Dense(16, activation="relu"), layers.Dense(1)]
    )
    generator = keras.Sequential(
        [keras.Input((latent,)), layers.Dense(16, activation="relu"), layers.Dense(16)]
    )
    gan = GAN(discriminator, generator, latent)
    gan.compile(
        d_optimizer=keras.optimizers.Adam(1e-3),
        g_optimizer=keras.optimizers.Adam(1e-3),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    x = _rng().normal(size=(N, 16)).astype("float32")
    return gan, tf.data.Dataset.from_tensor_slices(x), None, {}


# --- 2. A VAE whose Sampling layer draws float32 noise -------------------------


class Sampling(layers.Layer):
    """z = mean + exp(log_var / 2) * eps, with eps from tf.random.normal
    (float32, as written in many examples): fails under a bf16 policy."""

    def call(self, inputs):
        z_mean, z_log_var = inputs
        epsilon = tf.random.normal(tf.shape(z_mean))
        return z_mean + tf.exp(0.5 * z_log_var) * epsilon


class VAE(keras.Model):
    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.total = keras.metrics.Mean(name="loss")

    @property
    def metrics(self):
        return [self.total]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            error = tf.reduce_mean(tf.square(tf.cast(reconstruction, "float32") - data))
            kl = -0.5 * tf.reduce_mean(
                1 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var)
            )
            loss = error + 0.01 * tf.cast(kl, "float32")
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights, strict=True))
        self.total.update_state(loss)
        return {"loss": self.total.result()}


def make_vae():
    inputs = keras.Input((12,))
    h = layers.Dense(16, activation="relu")(inputs)
    z_mean, z_log_var = layers.Dense(2)(h), layers.Dense(2)(h)
    encoder = keras.Model(inputs, [z_mean, z_log_var, Sampling()([z_mean, z_log_var])])
    latent = keras.Input((2,))
    decoder = keras.Model(latent, layers.Dense(12)(layers.Dense(16)(latent)))
    vae = VAE(encoder, decoder)
    vae.compile(optimizer=keras.optimizers.Adam(1e-3))
    x = _rng(1).normal(size=(N, 12)).astype("float32")
    return vae, tf.data.Dataset.from_tensor_slices(x), None, {}


# --- 3. Custom layers whose __init__ takes no **kwargs (a transformer) ----------


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(vocab_size, embed_dim)
        self.pos_emb = layers.Embedding(maxlen, embed_dim)

    def call(self, x):
        positions = tf.range(tf.shape(x)[-1])
        return self.token_emb(x) + self.pos_emb(positions)


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)]
        )
        self.norm1 = layers.LayerNormalization(epsilon=1e-6)
        self.norm2 = layers.LayerNormalization(epsilon=1e-6)

    def call(self, inputs):
        out1 = self.norm1(inputs + self.att(inputs, inputs))
        return self.norm2(out1 + self.ffn(out1))


def make_transformer():
    maxlen, vocab = 16, 50
    inputs = keras.Input((maxlen,))
    h = TokenAndPositionEmbedding(maxlen, vocab, 16)(inputs)
    h = TransformerBlock(16, 2, 16)(h)
    h = layers.GlobalAveragePooling1D()(h)
    outputs = layers.Dense(2, activation="softmax")(h)
    model = keras.Model(inputs, outputs)
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    x = _rng(2).integers(0, vocab, size=(N, maxlen)).astype("int32")
    y = (x[:, 0] > vocab // 2).astype("int32")
    return model, x, y, {}


# --- 4. A Lambda with a plain Python function ----------------------------------


def double(t):
    return t * 2.0


def make_lambda():
    inputs = keras.Input((6,))
    h = layers.Lambda(double)(inputs)
    outputs = layers.Dense(1)(layers.Dense(8, activation="relu")(h))
    model = keras.Model(inputs, outputs)
    model.compile("adam", "mse")
    x = _rng(3).normal(size=(N, 6)).astype("float32")
    return model, x, x[:, :1] * 3, {}


# --- 5. An unregistered custom loss closure ------------------------------------


def weighted_mse(weight):
    def loss(y_true, y_pred):
        return weight * tf.reduce_mean(tf.square(y_true - y_pred), axis=-1)

    return loss


def make_loss_closure():
    model = keras.Sequential(
        [keras.Input((6,)), layers.Dense(8, activation="relu"), layers.Dense(1)]
    )
    model.compile("adam", weighted_mse(2.0))
    x = _rng(4).normal(size=(N, 6)).astype("float32")
    return model, tf.data.Dataset.from_tensor_slices((x, x[:, :1])), None, {}


# --- 6. A two-input siamese model ----------------------------------------------


def euclidean_distance(vectors):
    a, b = vectors
    return tf.sqrt(
        tf.maximum(tf.reduce_sum(tf.square(a - b), axis=1, keepdims=True), 1e-7)
    )


def contrastive(margin=1.0):
    def loss(y_true, y_pred):
        square = tf.square(y_pred)
        margin_square = tf.square(tf.maximum(margin - y_pred, 0))
        return tf.reduce_mean((1 - y_true) * square + y_true * margin_square)

    return loss


def make_siamese():
    tower = keras.Sequential(
        [keras.Input((8,)), layers.Dense(8, activation="tanh"), layers.Dense(4)]
    )
    a, b = keras.Input((8,)), keras.Input((8,))
    distance = layers.Lambda(euclidean_distance)([tower(a), tower(b)])
    outputs = layers.Dense(1, activation="sigmoid")(distance)
    model = keras.Model([a, b], outputs)
    model.compile("rmsprop", contrastive(1.0))
    rng = _rng(5)
    xa = rng.normal(size=(N, 8)).astype("float32")
    xb = rng.normal(size=(N, 8)).astype("float32")
    y = (np.abs(xa - xb).sum(axis=1) > 9).astype("float32")
    return model, [xa, xb], y, {}


# --- 7. A subclassed model without get_config ----------------------------------


class Regressor(keras.Model):
    def __init__(self, hidden):
        super().__init__()
        self.hidden = layers.Dense(hidden, activation="relu")
        self.out = layers.Dense(1)

    def call(self, x):
        return self.out(self.hidden(x))


def make_subclassed():
    model = Regressor(8)
    model.compile("adam", "mse")
    x = _rng(6).normal(size=(N, 5)).astype("float32")
    return model, x, x.sum(axis=1, keepdims=True), {}


# --- 8. Dict inputs -------------------------------------------------------------


def make_dict_inputs():
    age = keras.Input((1,), name="age")
    income = keras.Input((3,), name="income")
    h = layers.Concatenate()([age, income])
    outputs = layers.Dense(1, activation="sigmoid")(layers.Dense(8)(h))
    model = keras.Model({"age": age, "income": income}, outputs)
    model.compile("adam", "binary_crossentropy")
    rng = _rng(7)
    features = {
        "age": rng.normal(size=(N, 1)).astype("float32"),
        "income": rng.normal(size=(N, 3)).astype("float32"),
    }
    y = (features["age"][:, 0] > 0).astype("float32")
    return model, tf.data.Dataset.from_tensor_slices((features, y)), None, {}


# --- 9. A PyDataset ----------------------------------------------------------------


class Batches(keras.utils.PyDataset):
    def __init__(self, x, y, batch):
        super().__init__()
        self.x, self.y, self.batch = x, y, batch

    def __len__(self):
        return len(self.x) // self.batch

    def __getitem__(self, i):
        s = slice(i * self.batch, (i + 1) * self.batch)
        return self.x[s], self.y[s]


class Widened(keras.layers.Layer):
    """Its width is set after construction, outside its config: its config
    round-trips, so the model looks re-creatable, and re-creating it fails
    late, when the weights do not fit."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.units = 2

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], self.units))

    def call(self, x):
        return x @ self.w


def make_pydataset():
    model = keras.Sequential(
        [keras.Input((4,)), layers.Dense(8, activation="relu"), layers.Dense(1)]
    )
    model.compile("adam", "mse")
    x = _rng(8).normal(size=(N, 4)).astype("float32")
    return model, Batches(x, x[:, :1], 16), None, {}


# --- 10. A text pipeline with TextVectorization in a map -----------------------


def make_text():
    words = ["good", "great", "fine", "bad", "awful", "poor", "movie", "plot"]
    rng = _rng(9)
    texts = [" ".join(rng.choice(words, size=6)) for _ in range(N)]
    labels = np.array(
        [sum(w in ("good", "great", "fine") for w in t.split()) > 2 for t in texts],
        "float32",
    )
    vectorize = layers.TextVectorization(max_tokens=20, output_sequence_length=6)
    vectorize.adapt(texts)
    ds = tf.data.Dataset.from_tensor_slices((texts, labels)).map(
        lambda text, label: (vectorize(text), label)
    )
    model = keras.Sequential(
        [
            keras.Input((6,), dtype="int64"),
            layers.Embedding(20, 8),
            layers.GlobalAveragePooling1D(),
            layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    return model, ds, None, {}


# --- 11. A layer the user pinned to float32 ------------------------------------


def make_pinned():
    inputs = keras.Input((6,))
    h = layers.Dense(16, activation="relu")(inputs)
    h = layers.Dense(16, activation="relu", dtype="float32", name="pinned")(h)
    outputs = layers.Dense(1, name="head")(h)
    model = keras.Model(inputs, outputs)
    model.compile("adam", "mse")
    x = _rng(10).normal(size=(N, 6)).astype("float32")
    return model, x, x[:, :1] * 2, {}


ALL = {
    "gan": make_gan,
    "vae": make_vae,
    "transformer": make_transformer,
    "lambda": make_lambda,
    "loss_closure": make_loss_closure,
    "siamese": make_siamese,
    "subclassed": make_subclassed,
    "dict_inputs": make_dict_inputs,
    "pydataset": make_pydataset,
    "text": make_text,
    "pinned": make_pinned,
}


# --- A re-creatable layer that breaks under bf16 (TF ops mixing dtypes) --------


@keras.saving.register_keras_serializable(package="kerascale_tests")
class Noisy(layers.Layer):
    """x * (1 + 0.01 * N(0, 1)), the noise drawn as float32 with TF ops: a
    dtype mismatch at the first step under a bf16 policy."""

    def call(self, x, training=None):
        if training:
            return x * (1.0 + 0.01 * tf.random.normal(tf.shape(x)))
        return x

    def compute_output_shape(self, shape):
        return shape


def make_noisy():
    inputs = keras.Input((6,))
    h = Noisy()(layers.Dense(8, activation="relu")(inputs))
    model = keras.Model(inputs, layers.Dense(1)(h))
    model.compile("adam", "mse")
    x = _rng(11).normal(size=(N, 6)).astype("float32")
    return model, x, x[:, :1] * 2, {}
